package console_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/eclipse/paho.golang/paho"
	"github.com/shardq/shardq/broker"
	"github.com/shardq/shardq/config"
)

// The parts of the browser test: a node on loopback ports, MQTT clients
// (paho.golang, MQTT 5), and a browser tab driven with chromedp.

// ---- the node ----

type node struct {
	*broker.Broker
	base  string // http://host:port
	token string // the admin token, "" for none
}

// get reads the admin API as the test (the token's holder), not as the
// browser.
func (n *node) get(path string) (*http.Response, error) {
	req, err := http.NewRequest(http.MethodGet, n.base+path, nil)
	if err != nil {
		return nil, err
	}
	if n.token != "" {
		req.Header.Set("Authorization", "Bearer "+n.token)
	}
	return http.DefaultClient.Do(req)
}

func startNode(t *testing.T, token string) *node {
	t.Helper()
	cfg := config.Default()
	cfg.NodeID = "console-test"
	cfg.DataDir = t.TempDir()
	cfg.MQTT = "127.0.0.1:0"
	cfg.WS = ""
	cfg.HTTP = "127.0.0.1:0"
	cfg.Admin.Token = token
	cfg.Queues.Defaults.Partitions = 2
	orders := cfg.Queues.Defaults
	orders.Partitions = 4
	cfg.Queues.Declared["orders"] = orders
	var log *slog.Logger
	if os.Getenv("SHARDQ_TEST_LOG") != "" {
		log = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	b, err := broker.New(cfg, log)
	if err != nil {
		t.Fatalf("broker.New: %v", err)
	}
	errc := make(chan error, 1)
	go func() { errc <- b.Serve() }()
	deadline := time.Now().Add(10 * time.Second)
	for !b.Ready() {
		select {
		case err := <-errc:
			t.Fatalf("Serve: %v", err)
		case <-time.After(5 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatal("node not ready after 10s")
		}
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := b.Shutdown(ctx); err != nil {
			t.Errorf("Shutdown: %v", err)
		}
	})
	return &node{Broker: b, base: "http://" + b.HTTPAddr(), token: token}
}

// queue reads a queue through the admin API.
func (n *node) queue(t *testing.T, name string) broker.QueueView {
	t.Helper()
	res, err := n.get("/api/v1/queues/" + name)
	if err != nil {
		t.Fatalf("GET queue %s: %v", name, err)
	}
	defer res.Body.Close()
	var v broker.QueueView
	if err := json.NewDecoder(res.Body).Decode(&v); err != nil || res.StatusCode != http.StatusOK {
		t.Fatalf("GET queue %s: status %d, %v", name, res.StatusCode, err)
	}
	return v
}

// messages peeks at a queue through the admin API.
func (n *node) messages(t *testing.T, name string) []broker.MessageView {
	t.Helper()
	res, err := n.get("/api/v1/queues/" + name + "/messages?limit=100")
	if err != nil {
		t.Fatalf("peek %s: %v", name, err)
	}
	defer res.Body.Close()
	var l broker.MessageList
	if err := json.NewDecoder(res.Body).Decode(&l); err != nil {
		t.Fatalf("peek %s: %v", name, err)
	}
	return l.Messages
}

// waiting is how many dead letters of the queue wait, as the console
// counts them.
func waiting(v broker.QueueView) uint64 {
	if v.DLQ == nil {
		return 0
	}
	if len(v.DLQ.Groups) == 0 {
		return v.DLQ.Depth
	}
	var n uint64
	for _, g := range v.DLQ.Groups {
		n = max(n, g.Lag)
	}
	return n
}

func groupOf(v broker.QueueView, name string) broker.GroupView {
	for _, g := range v.Groups {
		if g.Name == name {
			return g
		}
	}
	return broker.GroupView{}
}

func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within 10s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// ---- MQTT clients (paho.golang, MQTT 5) ----

type client struct {
	t    *testing.T
	c    *paho.Client
	msgs chan *paho.Publish
}

func dial(t *testing.T, n *node, id string) *client {
	t.Helper()
	conn, err := net.DialTimeout("tcp", n.MQTTAddr(), 5*time.Second)
	if err != nil {
		t.Fatalf("dial: %v", err)
	}
	c := &client{t: t, msgs: make(chan *paho.Publish, 100)}
	c.c = paho.NewClient(paho.ClientConfig{
		Conn: conn, ClientID: id,
		OnPublishReceived: []func(paho.PublishReceived) (bool, error){
			func(r paho.PublishReceived) (bool, error) {
				c.msgs <- r.Packet
				return true, nil
			},
		},
	})
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if ca, err := c.c.Connect(ctx, &paho.Connect{ClientID: id, CleanStart: true, KeepAlive: 30}); err != nil || ca.ReasonCode != 0 {
		t.Fatalf("%s: connect: %v", id, err)
	}
	t.Cleanup(func() { _ = c.c.Disconnect(&paho.Disconnect{}) })
	return c
}

// publish sends a QoS 1 publish with user properties (name, value, ...)
// and checks that it was stored.
func (c *client) publish(topic string, payload []byte, props ...string) {
	c.t.Helper()
	p := &paho.Publish{Topic: topic, QoS: 1, Payload: payload, Properties: &paho.PublishProperties{}}
	for i := 0; i+1 < len(props); i += 2 {
		p.Properties.User.Add(props[i], props[i+1])
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if r, err := c.c.Publish(ctx, p); err != nil || r.ReasonCode != 0 {
		c.t.Fatalf("publish %s: %v", topic, err)
	}
}

// consume joins a group with explicit settlement.
func (c *client) consume(filter string) {
	c.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	s := &paho.Subscribe{Subscriptions: []paho.SubscribeOptions{{Topic: filter, QoS: 1}}, Properties: &paho.SubscribeProperties{}}
	s.Properties.User.Add("ack", "explicit")
	if sa, err := c.c.Subscribe(ctx, s); err != nil || sa.Reasons[0] != 1 {
		c.t.Fatalf("subscribe %s: %v", filter, err)
	}
}

// take waits for n deliveries and returns them by payload.
func (c *client) take(n int) map[string]*paho.Publish {
	c.t.Helper()
	got := map[string]*paho.Publish{}
	for len(got) < n {
		select {
		case p := <-c.msgs:
			got[string(p.Payload)] = p
		case <-time.After(10 * time.Second):
			c.t.Fatalf("%d deliveries of %d within 10s", len(got), n)
		}
	}
	return got
}

// settle publishes an explicit settlement ($ack, $reject) of a delivery.
func (c *client) settle(queue, verb, group string, p *paho.Publish) {
	c.t.Helper()
	c.publish("$queue/"+queue+"/$"+verb, nil, "msg-id", p.Properties.User.Get("msg-id"), "group", group)
}

// ---- the browser ----

// chromium returns the browser to drive, or skips the test.
func chromium(t *testing.T) string {
	t.Helper()
	if p := os.Getenv("SHARDQ_CHROMIUM"); p != "" {
		return p
	}
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome", "google-chrome-stable"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	t.Skip("chromium not found (Debian package chromium, which .ci/run installs; or set SHARDQ_CHROMIUM): the console is not tested in a browser")
	return ""
}

// newBrowser starts headless Chromium for the test; each tab of it is a
// context derived from the one returned.
func newBrowser(t *testing.T) context.Context {
	t.Helper()
	path := chromium(t)
	profile := t.TempDir()
	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(path),
		chromedp.NoSandbox,
		chromedp.DisableGPU,
		chromedp.Flag("disable-quic", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.UserDataDir(profile),
		chromedp.WindowSize(1360, 1000),
	)
	actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	t.Cleanup(cancelAlloc)
	ctx, cancel := chromedp.NewContext(actx)
	t.Cleanup(cancel)
	if err := chromedp.Do(ctx); err != nil { // starts the browser
		t.Fatalf("starting %s: %v", path, err)
	}
	return ctx
}

// tab is one browser tab on a node's console.
type tab struct {
	t    *testing.T
	ctx  context.Context
	base string // http://host:port
	node *node  // nil for a stand-in

	mu       sync.Mutex
	problems []string // exceptions and console errors of the page
}

func newTab(t *testing.T, browser context.Context, base string, n *node) *tab {
	t.Helper()
	ctx, cancel := chromedp.NewContext(browser)
	p := &tab{t: t, ctx: ctx, base: base, node: n}
	messages := chromedp.Console(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for m, err := range messages {
			if err != nil {
				return
			}
			// The browser logs every HTTP error answer (a 401 to a refused
			// change) as a network entry: those are expected.
			if (m.IsException() || m.Type == chromedp.ConsoleError) && m.Source != "network" {
				p.mu.Lock()
				p.problems = append(p.problems, m.String())
				p.mu.Unlock()
			}
		}
	}()
	t.Cleanup(func() {
		cancel()
		<-done
		p.mu.Lock()
		defer p.mu.Unlock()
		for _, m := range p.problems {
			t.Errorf("page console: %s", m)
		}
	})
	p.do("opening the console", chromedp.Navigate(base+"/"))
	return p
}

// do runs actions, failing the test with a screenshot and the page's text
// when one fails.
func (p *tab) do(what string, actions ...chromedp.Action[chromedp.Void]) {
	p.t.Helper()
	ctx, cancel := context.WithTimeout(p.ctx, 15*time.Second)
	defer cancel()
	if err := chromedp.Do(ctx, actions...); err != nil {
		p.fail(what, err)
	}
}

func (p *tab) fail(what string, err error) {
	p.t.Helper()
	ctx, cancel := context.WithTimeout(p.ctx, 5*time.Second)
	defer cancel()
	text, _ := chromedp.Run(ctx, chromedp.Evaluate[string](`document.body.innerText`))
	p.screenshot("failed-" + regexp.MustCompile(`[^A-Za-z0-9]+`).ReplaceAllString(p.t.Name(), "-"))
	p.t.Fatalf("%s: %v\n--- the page shows:\n%s", what, err, text)
}

// eval evaluates a JavaScript expression in the page.
func eval[T any](p *tab, expr string) T {
	p.t.Helper()
	ctx, cancel := context.WithTimeout(p.ctx, 10*time.Second)
	defer cancel()
	v, err := chromedp.Run(ctx, chromedp.Evaluate[T](expr))
	if err != nil {
		p.fail("evaluating "+expr, err)
	}
	return v
}

// waitFor waits until a JavaScript expression is true.
func (p *tab) waitFor(what, expr string) {
	p.t.Helper()
	p.do(what, chromedp.Func(func(ctx context.Context, t *chromedp.Target) error {
		_, err := chromedp.Poll[bool](expr, chromedp.WithPollingTimeout(10*time.Second), chromedp.WithPollingInterval(50*time.Millisecond))(ctx, t)
		return err
	}))
}

func js(s string) string {
	b, _ := json.Marshal(s)
	return string(b)
}

// text is the text of the first element matching a CSS selector, "" when
// there is none.
func (p *tab) text(sel string) string {
	p.t.Helper()
	return eval[string](p, `(document.querySelector(`+js(sel)+`) || {}).textContent || ""`)
}

// waitText waits until the element's text is want.
func (p *tab) waitText(sel, want string) {
	p.t.Helper()
	p.waitFor(fmt.Sprintf("%s showing %q", sel, want),
		`((e) => e !== null && e.textContent.trim() === `+js(want)+`)(document.querySelector(`+js(sel)+`))`)
}

// waitContains waits until the element's text contains want.
func (p *tab) waitContains(sel, want string) {
	p.t.Helper()
	p.waitFor(fmt.Sprintf("%s containing %q", sel, want),
		`((e) => e !== null && e.textContent.includes(`+js(want)+`))(document.querySelector(`+js(sel)+`))`)
}

// clearNotice takes the last notice away, so that the next one is new.
func (p *tab) clearNotice() {
	p.t.Helper()
	eval[bool](p, `((n) => { n.hidden = true; n.textContent = ""; return true })(document.getElementById("notice"))`)
}

// waitNotice waits for a notice matching a regular expression.
func (p *tab) waitNotice(re string) {
	p.t.Helper()
	p.waitFor("a notice matching "+re, `((n) => !n.hidden && new RegExp(`+js(re)+`).test(n.textContent))(document.getElementById("notice"))`)
}

// click clicks an element with the mouse once it is there and enabled.
func (p *tab) click(sel string) {
	p.t.Helper()
	p.waitFor(sel+" enabled", `((e) => e !== null && !e.disabled)(document.querySelector(`+js(sel)+`))`)
	p.do("clicking "+sel, chromedp.Click(chromedp.CSS(sel)))
}

// confirm answers the open confirmation dialog, after checking its text.
func (p *tab) confirm(ok bool, want string) {
	p.t.Helper()
	p.waitFor("the confirmation dialog", `document.getElementById("confirm").open`)
	if got := p.text("#confirm"); !strings.Contains(got, want) {
		p.t.Errorf("confirmation says %q, want it to mention %q", got, want)
	}
	if ok {
		p.click("#confirm-ok")
	} else {
		p.click("#confirm-cancel")
	}
	p.waitFor("the dialog closing", `!document.getElementById("confirm").open`)
}

// screenshot saves the whole page as NAME.png in the screenshot directory.
func (p *tab) screenshot(name string) {
	p.t.Helper()
	ctx, cancel := context.WithTimeout(p.ctx, 10*time.Second)
	defer cancel()
	png, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
	if err != nil {
		p.t.Logf("screenshot %s: %v", name, err)
		return
	}
	dir := os.Getenv("SHARDQ_SCREENSHOTS")
	if dir == "" {
		dir = filepath.Join("testdata", "screenshots")
	}
	file := filepath.Join(dir, name+".png")
	err = os.MkdirAll(dir, 0o755)
	if err == nil {
		err = os.WriteFile(file, png, 0o644)
	}
	if err != nil {
		p.t.Logf("screenshot %s: %v", name, err)
		return
	}
	abs, _ := filepath.Abs(file)
	p.t.Logf("screenshot: %s", abs)
}
