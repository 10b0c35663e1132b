package console_test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"regexp"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/eclipse/paho.golang/paho"
	"github.com/shardq/shardq/broker"
	"github.com/shardq/shardq/console"
)

// The console in a real browser: a real node, real MQTT clients filling its
// queues and dead-letter queues, and headless Chromium driven over the
// DevTools protocol, reading what the pages show and clicking their buttons.
// Screenshots go to $SHARDQ_SCREENSHOTS (default testdata/screenshots).

// xssPayload would run script if the console put a payload into the page as
// HTML.
const xssPayload = `<img src=x onerror="window.__shardqXSS=1"><script>window.__shardqXSS=2</script>`

var binaryPayload = []byte{0x00, 0x01, 0xfe, 0xff, 'A'}

func TestConsoleBrowser(t *testing.T) {
	chromium(t)
	// Each case has a browser of its own, closed before its node stops: a
	// connection the browser opened ahead of need, and never used, would
	// hold the node's HTTP shutdown for 5 s.
	t.Run("no token", func(t *testing.T) {
		n := startNode(t, "")
		seedOrders(t, n)
		p := newTab(t, newBrowser(t), n.base, n)
		p.overview()
		p.nodePanel()
		p.queuePage()
		p.replaySelected()
	})
	// Declaring a queue, changing its settings, publishing into it and
	// finding what was published, at a desktop's width and at a phone's.
	t.Run("forms", func(t *testing.T) {
		n := startNode(t, "")
		p := newTab(t, newBrowser(t), n.base, n)
		p.declareQueue()
		p.editSettings()
		p.publishForm()
		p.searchMessages()
		p.narrow()
	})
	t.Run("admin token", func(t *testing.T) {
		const token = "console-test-token"
		n := startNode(t, token)
		seedJobs(t, n)
		p := newTab(t, newBrowser(t), n.base, n)
		p.tokenRequired(token)
	})
	// No node has /api/v1/cluster yet: the cluster map is checked against
	// a stand-in for a clustered node's admin API.
	t.Run("cluster map", func(t *testing.T) {
		changes := &posts{}
		srv := httptest.NewServer(clusteredNode("", changes))
		t.Cleanup(srv.Close)
		p := newTab(t, newBrowser(t), srv.URL, nil)
		p.clusterMap()
		p.drainNodes(changes)
	})
	// SPEC section 9 has every /api/v1/ call need the token once one is
	// set, reads included: the console asks for it before it shows anything.
	t.Run("reads need the token", func(t *testing.T) {
		srv := httptest.NewServer(clusteredNode("read-token", &posts{}))
		t.Cleanup(srv.Close)
		p := newTab(t, newBrowser(t), srv.URL, nil)
		p.waitFor("the login", `!document.getElementById("login").hidden`)
		p.waitContains("#need-login", "Log in with the admin token")
		p.do("typing the token", chromedp.SendKeys(chromedp.CSS("#login-token"), "read-token"))
		p.click("#login-submit")
		p.waitText(`#queues tr[data-queue="orders"] td.depth`, "5")
		p.waitText(`#cluster tr[data-node="node-1"] td.node-state`, "up")
	})
}

// seedOrders fills the node: telemetry with 12 messages and no group;
// orders with 6 messages, of which the group billing acks one, rejects two
// (the HTML payload and the binary one: dead letters) and holds three. The
// group audit, with no consumer left, keeps all six stored.
func seedOrders(t *testing.T, n *node) {
	audit := dial(t, n, "audit-1")
	audit.consume("$share/audit/$queue/orders")
	_ = audit.c.Disconnect(&paho.Disconnect{})
	prod := dial(t, n, "producer")
	for i := range 12 {
		prod.publish("$queue/telemetry/dev-"+fmt.Sprint(i%3), []byte(fmt.Sprintf(`{"reading":%d}`, i)))
	}
	prod.publish("$queue/orders", []byte(`{"order":1}`), "key", "order-1")
	prod.publish("$queue/orders", []byte(`{"order":2}`), "key", "order-2")
	prod.publish("$queue/orders", []byte(xssPayload), "key", "<b>order-3</b>", "note", "<script>window.__shardqXSS=3</script>")
	prod.publish("$queue/orders", binaryPayload, "key", "order-4")
	prod.publish("$queue/orders", []byte(`{"order":5}`), "key", "order-5")
	prod.publish("$queue/orders", []byte(`{"order":6}`), "key", "order-6")

	billing := dial(t, n, "billing-1")
	billing.consume("$share/billing/$queue/orders/#")
	got := billing.take(6)
	billing.settle("orders", "ack", "billing", got[`{"order":1}`])
	billing.settle("orders", "reject", "billing", got[xssPayload])
	billing.settle("orders", "reject", "billing", got[string(binaryPayload)])
	waitUntil(t, "two dead letters and a lag of 3", func() bool {
		v := n.queue(t, "orders")
		return waiting(v) == 2 && groupOf(v, "billing").Lag == 3
	})
}

// seedJobs leaves one dead letter in jobs.
func seedJobs(t *testing.T, n *node) {
	prod := dial(t, n, "producer")
	prod.publish("$queue/jobs", []byte("resize photo 17"))
	workers := dial(t, n, "worker-1")
	workers.consume("$share/workers/$queue/jobs")
	workers.settle("jobs", "reject", "workers", workers.take(1)["resize photo 17"])
	waitUntil(t, "a dead letter in jobs", func() bool { return waiting(n.queue(t, "jobs")) == 1 })
}

// ---- what the pages show ----

func (p *tab) overview() {
	p.t.Helper()
	p.waitFor("the redirect to /ui/", `location.pathname === "/ui/"`)
	p.waitText(`#queues tr[data-queue="orders"] td.depth`, "6")
	p.waitText(`#queues tr[data-queue="telemetry"] td.depth`, "12")
	p.waitText(`#queues tr[data-queue="orders"] td.dlq`, "2")
	p.waitText(`#queues tr[data-queue="orders"] td.consumers`, "1")
	p.waitText(`#groups tr[data-queue="orders"][data-group="billing"] td.lag`, "3")
	p.waitText(`#groups tr[data-queue="orders"][data-group="billing"] td.leased`, "3")
	p.waitText("#node", "node console-test")
	p.waitText("#ready", "ready")
	// Rates need two polls of the counters.
	p.waitFor("a rate", `/^[0-9]/.test(document.querySelector('#queues tr[data-queue="orders"] td.rate-in').textContent)`)
	if !eval[bool](p, `document.getElementById("login").hidden`) {
		p.t.Error("the login shows on a node without an admin token")
	}
	if got := p.text("#session"); got != "no admin token" {
		p.t.Errorf("session shows %q", got)
	}
	if eval[bool](p, `document.getElementById("cluster") !== null`) {
		p.t.Error("a cluster section on a single node")
	}
	p.screenshot("overview")
}

func (p *tab) queuePage() {
	p.t.Helper()
	p.click(`#queues tr[data-queue="orders"] a.queue-link`)
	p.waitText("#queue-name", "orders")
	p.waitFor("4 partitions", `document.querySelectorAll("table.partitions tbody tr").length === 4`)
	p.waitText(`table.groups tr[data-group="billing"] td.lag`, "3")
	p.waitText(`table.groups tr[data-group="billing"] td.consumers`, "1")
	p.waitText(`table.groups tr[data-group="billing"] td.leased`, "3")
	// Who consumes: billing's consumer, holding its 3.
	p.waitText(`table.consumers tr[data-client="billing-1"] td.held`, "3")
	// The charts of the last hour, once two samples are taken (every 5 s).
	p.waitFor("the depth and rate charts", `document.querySelector("#chart-depth polyline.depth") !== null && document.querySelector("#chart-rates polyline.in") !== null`)
	// A poll keeps what it did not change: the buttons stay the same
	// elements, so a click is never lost to a button replaced under the
	// pointer.
	eval[bool](p, `(window.keptButtons = [document.getElementById("purge-queue"), document.querySelector('table.groups tr[data-group="billing"] button.delete-group')], true)`)
	polled := p.text("#refreshed")
	p.waitFor("a poll", `document.getElementById("refreshed").textContent !== `+js(polled))
	if !eval[bool](p, `window.keptButtons.every((b) => b !== null && b.isConnected)`) {
		p.t.Error("a poll replaced the buttons of the queue page")
	}
	p.waitFor("two dead letters", `document.querySelectorAll("#dlq tr.letter.waiting").length === 2`)
	p.waitContains("#dlq-summary", "2 dead letters waiting")

	// The HTML payload is shown as text: no element comes of it.
	p.waitFor("the HTML payload as text", `[...document.querySelectorAll("#dlq .text-preview")].some((e) => e.textContent === `+js(xssPayload)+`)`)
	if n := eval[int](p, `document.querySelectorAll("#main img, #main script").length`); n != 0 {
		p.t.Errorf("%d img or script elements in the page: a payload was taken as HTML", n)
	}
	if !eval[bool](p, `[...document.querySelectorAll("#dlq td.key")].some((e) => e.textContent === "<b>order-3</b>")`) {
		p.t.Error("the key <b>order-3</b> is not shown as text")
	}
	// The binary payload is shown as hex, and in full with "more".
	p.waitContains("#dlq .hex-preview", "00 01 fe ff 41")
	bin := eval[string](p, `[...document.querySelectorAll("#dlq tr.letter")].find((r) => r.querySelector(".hex-preview")).dataset.msgId`)
	p.click(`#dlq tr[data-msg-id="` + bin + `"] button.show`)
	p.waitContains(`#dlq tr[data-detail-of="`+bin+`"] pre.payload-hex`, "00000000  00 01 fe ff 41")
	p.waitContains(`#dlq tr[data-detail-of="`+bin+`"] pre.payload-hex`, "|....A|")
	p.waitContains(`#dlq tr[data-detail-of="`+bin+`"] .props`, "rejected")
	p.click(`#dlq tr[data-msg-id="` + bin + `"] button.show`)
	html := eval[string](p, `[...document.querySelectorAll("#dlq tr.letter")].find((r) => r.querySelector(".text-preview")).dataset.msgId`)
	p.click(`#dlq tr[data-msg-id="` + html + `"] button.show`)
	p.waitContains(`#dlq tr[data-detail-of="`+html+`"] pre.payload-text`, xssPayload)
	p.waitContains(`#dlq tr[data-detail-of="`+html+`"] .props`, "<script>window.__shardqXSS=3</script>")
	if n := eval[int](p, `document.querySelectorAll("#main img, #main script").length`); n != 0 {
		p.t.Errorf("%d img or script elements in the page: a payload or property was taken as HTML", n)
	}
	if eval[bool](p, `window.__shardqXSS !== undefined`) {
		p.t.Error("a payload's script ran")
	}
	p.screenshot("queue")
	p.click(`#dlq tr[data-msg-id="` + html + `"] button.show`)

	// A group's position per partition, and a peek at the queue.
	p.click(`table.groups tr[data-group="billing"] button.toggle`)
	p.waitFor("billing per partition", `document.querySelectorAll("table.group-partitions tbody tr").length === 4`)
	p.click(`table.groups tr[data-group="billing"] button.toggle`)
	p.click("#peek-open")
	p.waitFor("the peeked messages", `document.querySelectorAll("table.messages tbody tr").length === 6`)
	p.waitContains("table.messages", `{"order":2}`)
}

// replaySelected replays the HTML payload's dead letter with the console and
// checks through the admin API that it went back into the queue.
func (p *tab) replaySelected() {
	p.t.Helper()
	n := p.node
	id := eval[string](p, `[...document.querySelectorAll("#dlq tr.letter")].find((r) => r.querySelector(".text-preview")).dataset.msgId`)
	p.click(`#dlq tr[data-msg-id="` + id + `"] input.select`)
	p.waitText("#replay-selected", "Replay selected (1)…")

	// Cancelled: nothing happens.
	p.click("#replay-selected")
	p.confirm(false, id)
	time.Sleep(300 * time.Millisecond)
	if v := n.queue(p.t, "orders"); waiting(v) != 2 || v.Counts.Enqueued != 6 {
		p.t.Fatalf("after a cancelled replay: %d dead letters waiting, %d enqueued", waiting(v), v.Counts.Enqueued)
	}

	p.click("#replay-selected")
	p.confirm(true, id)
	p.waitNotice(`^Replayed 1 dead letter into orders: ` + id + ` → \d+-\d+\.`)
	v := n.queue(p.t, "orders")
	if waiting(v) != 1 || v.Counts.Enqueued != 7 {
		p.t.Errorf("after the replay: %d dead letters waiting, %d enqueued; want 1 and 7", waiting(v), v.Counts.Enqueued)
	}
	copies := 0
	for _, m := range n.messages(p.t, "orders") {
		if string(m.Payload) == xssPayload {
			copies++
		}
	}
	if copies != 2 {
		p.t.Errorf("orders holds %d messages with the replayed payload, want 2 (the original and its copy)", copies)
	}
	// The group that dead-lettered it has it again, and the page follows.
	p.waitText(`table.groups tr[data-group="billing"] td.lag`, "4")
	p.waitContains("#dlq-summary", "1 dead letter waiting")
	p.waitFor("the replayed letter gone or marked", `((r) => r === null || r.classList.contains("replayed") || r.classList.contains("settled"))(document.querySelector('#dlq tr[data-msg-id="`+id+`"]'))`)
	p.screenshot("replayed")

	// Moving a group: to latest, nothing is left for it to read.
	p.clearNotice()
	p.click(`table.groups tr[data-group="audit"] button.seek-group`)
	p.do("typing the point", chromedp.SetValue(chromedp.CSS(`#confirm-input`), "latest"))
	p.confirm(true, "PARTITION:OFFSET")
	p.waitNotice(`^Moved group audit of orders to latest \(`)
	p.waitText(`table.groups tr[data-group="audit"] td.lag`, "0")

	// Deleting a group: refused while it has consumers, done when it has none.
	p.clearNotice()
	p.click(`table.groups tr[data-group="billing"] button.delete-group`)
	p.confirm(true, "billing")
	p.waitNotice(`has consumers connected`)
	p.clearNotice()
	p.click(`table.groups tr[data-group="audit"] button.delete-group`)
	p.confirm(true, "audit")
	p.waitNotice(`^Deleted group audit of orders\.`)
	p.waitFor("audit gone", `document.querySelector('table.groups tr[data-group="audit"]') === null`)
	if g := groupOf(n.queue(p.t, "orders"), "audit"); g.Name != "" {
		p.t.Error("the group audit is still there")
	}
}

// tokenRequired checks that, with an admin token, the console shows
// nothing until the operator logs in (every /api/v1/ call needs the token,
// reads included), a wrong token is reported and not kept, and the right
// one shows the queues and lets changes through.
func (p *tab) tokenRequired(token string) {
	p.t.Helper()
	n := p.node
	p.waitFor("the login", `!document.getElementById("login").hidden`)
	p.waitContains("#need-login", "Log in with the admin token")
	if eval[bool](p, `document.querySelectorAll("#queues tr[data-queue]").length !== 0`) {
		p.t.Error("queues show before logging in")
	}

	// A wrong token is refused at login and not kept.
	p.do("typing a wrong token", chromedp.SendKeys(chromedp.CSS("#login-token"), "not-the-token"))
	p.click("#login-submit")
	p.waitContains("#login-error", "Wrong token")
	if eval[bool](p, `sessionStorage.length !== 0`) {
		p.t.Error("a wrong token was kept")
	}
	p.screenshot("login")

	eval[bool](p, `(document.getElementById("login-token").value = "") === ""`)
	p.do("typing the token", chromedp.SendKeys(chromedp.CSS("#login-token"), token))
	p.click("#login-submit")
	p.waitContains("#session", "logged in")
	if !eval[bool](p, `document.getElementById("login").hidden`) {
		p.t.Error("the login still shows after logging in")
	}
	if got := eval[string](p, `sessionStorage.getItem("shardq.admin_token")`); got != token {
		p.t.Errorf("sessionStorage holds %q", got)
	}
	p.do("opening jobs", chromedp.Navigate(n.base+"/ui/#/queues/jobs"))
	p.waitText("#queue-name", "jobs")
	p.waitFor("the dead letter", `document.querySelectorAll("#dlq tr.letter.waiting").length === 1`)
	p.clearNotice()
	p.click("#replay-all")
	p.confirm(true, "jobs")
	p.waitNotice(`^Replayed 1 dead letter into jobs`)
	if v := n.queue(p.t, "jobs"); waiting(v) != 0 || v.Counts.Enqueued != 2 {
		p.t.Errorf("after the replay: %d dead letters waiting, %d enqueued; want 0 and 2", waiting(v), v.Counts.Enqueued)
	}
	// The replayed message is back in jobs, leased by the worker; the
	// purge deletes it (and the original, if retention has not yet).
	p.clearNotice()
	p.click("#purge-queue")
	p.confirm(true, "cannot be undone")
	p.waitNotice(`^Purged [12] messages? from jobs`)
	if v := n.queue(p.t, "jobs"); v.Depth != 0 {
		p.t.Errorf("after the purge: jobs holds %d messages", v.Depth)
	}

	// Deleting the queue takes it, its groups and its dead-letter queue
	// away, and the console goes back to the overview without it.
	p.clearNotice()
	p.click("#delete-queue")
	p.confirm(true, "cannot be undone")
	p.waitNotice(`^Deleted jobs with `)
	res, err := n.get("/api/v1/queues/jobs")
	if err != nil {
		p.t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != http.StatusNotFound {
		p.t.Errorf("after the delete: GET jobs answers %d, want 404", res.StatusCode)
	}
	p.waitFor("the overview without jobs", `location.hash === "#/" && !document.querySelector('#queues tr[data-queue="jobs"]')`)
}

// posts records the changes a stand-in node was asked for.
type posts struct {
	mu    sync.Mutex
	paths []string
}

func (p *posts) add(path string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.paths = append(p.paths, path)
}

func (p *posts) list() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Clone(p.paths)
}

// clusteredNode serves the console and the reads of a clustered node's
// admin API, with the cluster document of SPEC section 7: a node up, one
// draining, one down, one catching up as a learner and one drained. It
// answers drains and undrains, recording them in changes. With a token,
// every call needs it.
func clusteredNode(token string, changes *posts) http.Handler {
	orders := broker.QueueView{Node: "node-1", Name: "orders", Settings: broker.Settings{Partitions: 2}, Depth: 5,
		Groups:     []broker.GroupView{{Name: "billing", Consumers: 2, Lag: 1}},
		Partitions: []broker.PartitionView{{Partition: 0, Next: 3, Committed: 3, Depth: 3}, {Partition: 1, Next: 2, Committed: 2, Depth: 2}}}
	list := broker.QueueList{Node: "node-1", Queues: []broker.QueueView{orders}}
	list.Queues[0].Partitions = nil
	const cluster = `{
	  "node": "node-1", "clustered": true,
	  "nodes": [
	    {"id": "node-1", "mqtt": "127.0.0.1:11883", "http": "127.0.0.1:11990", "cluster_addr": "127.0.0.1:11400", "state": "up", "drained": false, "replicas": 2, "leads": 1},
	    {"id": "node-2", "mqtt": "127.0.0.1:12883", "http": "127.0.0.1:12990", "cluster_addr": "127.0.0.1:12400", "state": "draining", "drained": true, "replicas": 2, "leads": 1},
	    {"id": "node-3", "mqtt": "", "http": "", "cluster_addr": "", "state": "down", "drained": false, "replicas": 2, "leads": 0},
	    {"id": "node-4", "mqtt": "127.0.0.1:14883", "http": "127.0.0.1:14990", "cluster_addr": "127.0.0.1:14400", "state": "up", "drained": false, "replicas": 1, "leads": 0},
	    {"id": "node-5", "mqtt": "127.0.0.1:15883", "http": "127.0.0.1:15990", "cluster_addr": "127.0.0.1:15400", "state": "drained", "drained": true, "replicas": 0, "leads": 0}
	  ],
	  "partitions": [
	    {"queue": "orders", "partition": 0, "owner": "node-1", "epoch": 4, "replicas": ["node-1", "node-2", "node-3"], "learners": ["node-4"], "in_sync": ["node-1", "node-2"]},
	    {"queue": "orders", "partition": 1, "owner": "node-2", "epoch": 7, "replicas": ["node-2", "node-1", "node-3"], "learners": [], "in_sync": ["node-2", "node-1"]}
	  ]
	}`
	authorized := func(w http.ResponseWriter, r *http.Request) bool {
		w.Header().Set("Content-Type", "application/json")
		if token != "" && r.Header.Get("Authorization") != "Bearer "+token {
			w.WriteHeader(http.StatusUnauthorized)
			_, _ = w.Write([]byte(`{"error": "missing bearer token"}`))
			return false
		}
		return true
	}
	reply := func(v any) http.HandlerFunc {
		return func(w http.ResponseWriter, r *http.Request) {
			if !authorized(w, r) {
				return
			}
			if s, ok := v.(string); ok {
				_, _ = w.Write([]byte(s))
				return
			}
			_ = json.NewEncoder(w).Encode(v)
		}
	}
	mux := http.NewServeMux()
	mux.Handle(console.Prefix, console.New(console.Options{Token: token}))
	mux.Handle("GET /{$}", http.RedirectHandler(console.Prefix, http.StatusFound))
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, r *http.Request) { _, _ = w.Write([]byte("ready\n")) })
	mux.HandleFunc("GET /api/v1/queues", reply(list))
	mux.HandleFunc("GET /api/v1/queues/orders", reply(orders))
	mux.HandleFunc("GET /api/v1/queues/orders/dlq/messages", reply(broker.MessageList{Messages: []broker.MessageView{}}))
	mux.HandleFunc("GET /api/v1/cluster", reply(cluster))
	mux.HandleFunc("POST /api/v1/cluster/nodes/{node}/{change}", func(w http.ResponseWriter, r *http.Request) {
		if !authorized(w, r) {
			return
		}
		change := r.PathValue("change")
		if change != "drain" && change != "undrain" {
			w.WriteHeader(http.StatusNotFound)
			_, _ = w.Write([]byte(`{"error": "no such endpoint"}`))
			return
		}
		changes.add(r.URL.Path)
		_ = json.NewEncoder(w).Encode(broker.DrainView{Node: r.PathValue("node"), Drained: change == "drain"})
	})
	return mux
}

func (p *tab) clusterMap() {
	p.t.Helper()
	p.waitText(`#cluster tr[data-node="node-3"] td.node-state`, "down")
	p.waitText(`#cluster tr[data-node="node-1"] td.node-state`, "up")
	p.waitText(`#cluster tr[data-node="node-2"] td.node-state`, "draining")
	p.waitText(`#cluster tr[data-node="node-5"] td.node-state`, "drained")
	for node, class := range map[string]string{"node-1": "ok", "node-2": "warn", "node-3": "bad", "node-5": "muted"} {
		if !eval[bool](p, `document.querySelector('#cluster tr[data-node="`+node+`"] td.node-state').classList.contains(`+js(class)+`)`) {
			p.t.Errorf("the state of %s is not shown as %s", node, class)
		}
	}
	p.waitContains(`#cluster table.owners`, "node-2, node-1, node-3")
	p.waitText(`#cluster tr[data-node="node-2"] td.replicas`, "2")
	p.waitText(`#cluster tr[data-node="node-2"] td.leads`, "1")
	p.waitText(`#cluster tr[data-node="node-4"] td.replicas`, "1")
	p.waitText(`#cluster tr[data-node="node-4"] td.leads`, "0")
	p.waitContains(`#cluster table.owners thead`, "Learners")
	// The node the console talks to is marked; a cluster has no panel
	// of a single node.
	p.waitContains(`#cluster tr[data-node="node-1"] td.name`, "this node")
	if eval[bool](p, `document.querySelector('#cluster tr[data-node="node-2"] .this-node') !== null || document.getElementById("node-panel") !== null`) {
		p.t.Error("another node is marked as this one, or a cluster shows a single node's panel")
	}
	if got := eval[[]string](p, `[...document.querySelectorAll("#cluster table.owners td.learners")].map((e) => e.textContent)`); !slices.Equal(got, []string{"node-4", ""}) {
		p.t.Errorf("learners per partition: %q, want node-4 and none", got)
	}
	// A node drained has Undrain, the others Drain.
	for node, button := range map[string]string{"node-1": "Drain…", "node-2": "Undrain…", "node-3": "Drain…", "node-5": "Undrain…"} {
		p.waitText(`#cluster tr[data-node="`+node+`"] td.actions button`, button)
	}
	p.screenshot("cluster")
	p.do("opening orders", chromedp.Navigate(p.base+"/ui/#/queues/orders"))
	p.waitText("#queue-name", "orders")
	p.waitContains("table.partitions thead", "Owner")
	p.waitContains(`table.partitions tr[data-partition="1"]`, "node-2")
	p.do("back to the overview", chromedp.Navigate(p.base+"/ui/#/"))
}

// drainNodes drains and undrains nodes with the cluster map's buttons:
// each asks first; a cancelled one calls nothing.
func (p *tab) drainNodes(changes *posts) {
	p.t.Helper()
	p.click(`#cluster tr[data-node="node-1"] button.drain-node`)
	p.confirm(false, "node-1 is given no partition, replica or leadership, and the 2 replicas it holds move")
	time.Sleep(300 * time.Millisecond)
	if got := changes.list(); len(got) != 0 {
		p.t.Fatalf("a cancelled drain called %q", got)
	}
	p.click(`#cluster tr[data-node="node-1"] button.drain-node`)
	p.confirm(true, "Once its state is drained it holds nothing and can be stopped")
	p.waitNotice(`^Drained node-1: its partitions move to the other nodes\.`)
	p.clearNotice()
	p.click(`#cluster tr[data-node="node-2"] button.undrain-node`)
	p.confirm(true, "node-2 takes its share of partitions")
	p.waitNotice(`^Undrained node-2: it takes its share of partitions again\.`)
	want := []string{"/api/v1/cluster/nodes/node-1/drain", "/api/v1/cluster/nodes/node-2/undrain"}
	if got := changes.list(); !slices.Equal(got, want) {
		p.t.Errorf("calls %q, want %q", got, want)
	}
}

// set sets the value of an input, a select or a textarea.
func (p *tab) set(sel, value string) {
	p.t.Helper()
	p.do("setting "+sel, chromedp.SetValue(chromedp.CSS(sel), value))
}

// nodePanel checks a single node's panel on the overview: its id, state,
// addresses and the partitions it leads (all of them: orders' 4 and
// telemetry's 2).
func (p *tab) nodePanel() {
	p.t.Helper()
	p.waitContains("#node-panel", "console-test")
	p.waitContains("#node-panel", "Partitions led6")
	p.waitContains("#node-panel", p.node.MQTTAddr())
	p.waitContains("#node-panel", "ready")
	if eval[bool](p, `document.querySelector("#node-panel button") !== null`) {
		p.t.Error("the panel of a single node offers a drain")
	}
	p.screenshot("node-panel")
}

// declareQueue declares invoices with the overview's form: cancelled, it
// declares nothing; confirmed, the queue has the settings given and the
// console shows it.
func (p *tab) declareQueue() {
	p.t.Helper()
	n := p.node
	p.waitFor("the overview", `document.getElementById("new-queue") !== null`)
	p.click("#new-queue")
	p.set("#declare-name", "invoices")
	p.set("#declare-partitions", "3")
	p.set("#declare-ack_timeout", "10s")
	p.set("#declare-ordering", "partition")
	p.screenshot("declare")
	p.click("#declare-submit")
	p.confirm(false, "The queue invoices is created with partitions 3, ordering partition, ack_timeout 10s")
	time.Sleep(300 * time.Millisecond)
	if res, err := n.get("/api/v1/queues/invoices"); err != nil || res.StatusCode != http.StatusNotFound {
		p.t.Fatalf("after a cancelled declare: GET invoices: %v %v", res.Status, err)
	}
	p.click("#declare-submit")
	p.confirm(true, "the config's defaults for the rest")
	p.waitNotice(`^Declared invoices: partitions 3, ordering partition, ack_timeout 10s\.`)
	p.waitText("#queue-name", "invoices")
	p.waitFor("3 partitions", `document.querySelectorAll("table.partitions tbody tr").length === 3`)
	v := n.queue(p.t, "invoices")
	if v.Settings.Partitions != 3 || v.Settings.AckTimeout != broker.Duration(10*time.Second) || v.Settings.Ordering != "partition" || v.Source != "api" {
		p.t.Errorf("invoices: %+v", v.Settings)
	}
}

// editSettings changes a setting of invoices with the queue page's form,
// and shows the API's refusal of a partition count change in the form.
func (p *tab) editSettings() {
	p.t.Helper()
	n := p.node
	before := n.queue(p.t, "invoices").Settings.MaxDeliveries
	p.click("#edit-settings")
	p.waitFor("the settings form", `document.getElementById("declare-max_deliveries") !== null`)
	if got := eval[string](p, `document.getElementById("declare-ack_timeout").value`); got != "10s" {
		p.t.Errorf("the form shows ack_timeout %q, want the queue's 10s", got)
	}
	// Nothing changed: nothing is sent.
	p.click("#declare-submit")
	p.waitContains("#declare-error", "Nothing changed")

	p.set("#declare-partitions", "2")
	p.click("#declare-submit")
	p.confirm(true, "partitions 3 → 2")
	p.waitFor("the refusal in the form", `!document.getElementById("declare-error").hidden && /partition/.test(document.getElementById("declare-error").textContent)`)
	refusal := p.text("#declare-error")
	p.waitNotice(regexp.QuoteMeta(refusal))
	p.screenshot("declare-refused")
	if v := n.queue(p.t, "invoices"); v.Settings.Partitions != 3 {
		p.t.Fatalf("after a refused change: %d partitions", v.Settings.Partitions)
	}

	p.set("#declare-partitions", "3")
	p.set("#declare-max_deliveries", "7")
	p.click("#declare-submit")
	p.confirm(true, fmt.Sprintf("max_deliveries %d → 7", before))
	p.waitNotice(fmt.Sprintf(`^Changed the settings of invoices: max_deliveries %d → 7\.`, before))
	p.waitFor("the form closed", `document.getElementById("declare-form") === null`)
	if v := n.queue(p.t, "invoices"); v.Settings.MaxDeliveries != 7 {
		p.t.Errorf("max_deliveries %d after the change, want 7", v.Settings.MaxDeliveries)
	}
	p.waitContains("#settings", "max_deliveries7")
}

// publishForm publishes into invoices with the queue page's form: a key,
// a subject, a text payload and user properties.
func (p *tab) publishForm() {
	p.t.Helper()
	n := p.node
	p.click("#publish-open")
	p.set("#publish-subject", "eu")
	p.set("#publish-key", "cust-1")
	p.set("#publish-payload", `{"total": 12.5}`)
	p.click("#publish-add-prop")
	p.set("#publish-prop-rows .prop-row:last-child .prop-name", "trace")
	p.set("#publish-prop-rows .prop-row:last-child .prop-value", "t-1")
	p.click("#publish-add-prop")
	p.set("#publish-prop-rows .prop-row:last-child .prop-value", "orphan")
	p.click("#publish-submit")
	p.waitContains("#publish-error", "no name")
	p.click("#publish-prop-rows .prop-row:last-child .prop-remove")
	p.screenshot("publish")

	p.click("#publish-submit")
	p.confirm(false, "A message of 15 bytes with key cust-1 and 1 user property is stored in $queue/invoices/eu")
	time.Sleep(300 * time.Millisecond)
	if v := n.queue(p.t, "invoices"); v.Counts.Enqueued != 0 {
		p.t.Fatalf("a cancelled publish stored %d messages", v.Counts.Enqueued)
	}
	p.click("#publish-submit")
	p.confirm(true, "delivered to the groups of invoices as any producer's message")
	p.waitNotice(`^Published \d+-\d+ to \$queue/invoices/eu \(partition \d+, offset 0\)\.`)
	id := p.text("#published-id")
	msgs := n.messages(p.t, "invoices")
	if len(msgs) != 1 || msgs[0].ID != id || msgs[0].Key != "cust-1" || string(msgs[0].Payload) != `{"total": 12.5}` ||
		msgs[0].Topic != "$queue/invoices/eu" || len(msgs[0].UserProperties) != 1 || msgs[0].UserProperties[0] != (broker.Property{Name: "trace", Value: "t-1"}) {
		p.t.Errorf("invoices holds %+v; the console says it published %s", msgs, id)
	}
	// The form keeps what was typed, for the next one.
	if got := eval[string](p, `document.getElementById("publish-key").value`); got != "cust-1" {
		p.t.Errorf("the key field holds %q after publishing", got)
	}
}

// searchMessages finds messages of invoices by msg-id and by key with the
// queue page's search box.
func (p *tab) searchMessages() {
	p.t.Helper()
	prod := dial(p.t, p.node, "producer")
	for i := range 4 {
		prod.publish("$queue/invoices", fmt.Appendf(nil, "invoice %d", i), "key", []string{"cust-1", "cust-2"}[i%2], "n", fmt.Sprint(i))
	}
	id := p.text("#published-id")
	p.click("#published-find")
	p.waitFor("the message found", `document.querySelectorAll("table.search-results tbody tr").length === 1`)
	p.waitText(`table.search-results tr[data-msg-id="`+id+`"] td.key`, "cust-1")
	p.waitContains(`table.search-results tr[data-msg-id="`+id+`"] td.props`, "trace=t-1")
	p.click(`table.search-results tr[data-msg-id="` + id + `"] button.show`)
	p.waitContains(`table.search-results tr[data-detail-of="`+id+`"] .props`, "property trace")
	p.waitContains(`table.search-results tr[data-detail-of="`+id+`"] .props`, "$queue/invoices/eu")

	p.set("#search-by", "key")
	p.set("#search-input", "cust-1")
	p.click("#search-submit")
	p.waitFor("three messages of cust-1", `document.querySelectorAll("table.search-results tbody tr").length === 3`)
	p.waitContains("#search-summary", "3 messages with key cust-1 in invoices, partition ")
	// Newest first: the MQTT ones, then the form's.
	got := eval[[]string](p, `[...document.querySelectorAll("table.search-results td.payload .text-preview")].map((e) => e.textContent)`)
	if !slices.Equal(got, []string{"invoice 2", "invoice 0", `{"total": 12.5}`}) {
		p.t.Errorf("payloads found for cust-1: %q", got)
	}
	p.screenshot("search")

	p.set("#search-by", "id")
	p.set("#search-input", "0-999")
	p.click("#search-submit")
	p.waitContains("#search-error", "no message 0-999 in invoices")
	p.set("#search-input", "nonsense")
	p.click("#search-submit")
	p.waitContains("#search-error", "PARTITION-OFFSET")
}

// narrow checks the queue page and its forms at a phone's width: nothing
// is wider than the screen, and a notice of this page goes with it.
func (p *tab) narrow() {
	p.t.Helper()
	p.do("a 400 px screen", chromedp.EmulateViewport(400, 900))
	p.do("the page again", chromedp.Reload())
	p.waitText("#queue-name", "invoices")
	p.click("#publish-open")
	p.click("#publish-add-prop")
	p.click("#edit-settings")
	p.set("#search-input", "cust-2")
	p.click("#search-submit")
	p.waitFor("two messages of cust-2", `document.querySelectorAll("table.search-results tbody tr").length === 2`)
	p.click(`table.search-results tbody tr button.show`)
	if w := eval[int](p, `document.documentElement.scrollWidth`); w > 400 {
		p.t.Errorf("the queue page is %d px wide on a 400 px screen", w)
	}
	for _, sel := range []string{"#publish-submit", "#declare-submit", "#search-submit", "#purge-queue"} {
		if right := eval[float64](p, `document.querySelector(`+js(sel)+`).getBoundingClientRect().right`); right > 400 {
			p.t.Errorf("%s reaches %.0f px on a 400 px screen", sel, right)
		}
	}
	p.screenshot("narrow-queue")

	// A notice raised here goes when the operator leaves the page.
	p.click("#declare-submit")
	p.waitContains("#declare-error", "Nothing changed")
	p.set("#declare-ack_timeout", "soon")
	p.click("#declare-submit")
	p.confirm(true, "ack_timeout 10s → soon")
	p.waitFor("an error notice", `!document.getElementById("notice").hidden && document.getElementById("notice").classList.contains("error")`)
	p.click(`.crumbs a`)
	p.waitFor("the overview", `document.querySelector('#queues tr[data-queue="invoices"]') !== null`)
	if !eval[bool](p, `document.getElementById("notice").hidden`) {
		p.t.Errorf("the notice of the queue page still shows on the overview: %q", p.text("#notice"))
	}
	if w := eval[int](p, `document.documentElement.scrollWidth`); w > 400 {
		p.t.Errorf("the overview is %d px wide on a 400 px screen", w)
	}
	p.screenshot("narrow-overview")
}
