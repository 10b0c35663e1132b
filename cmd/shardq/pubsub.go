package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/eclipse/paho.golang/paho"

	"github.com/shardq/shardq/queue"
)

// shardq pub and shardq sub: an MQTT 5 producer and consumer for quick
// tests, which say what the broker answered (reason codes and strings)
// and can settle a delivery as a consumer would: ack, nack, reject,
// release or nothing.

const pubUsage = `usage: shardq pub TOPIC [--message TEXT] [--key KEY] [--count N] [flags]

Publishes to TOPIC over MQTT 5 at QoS 1 and prints the broker's answer to
each publish: its reason code and, when it refused, why. To a queue
($queue/NAME) a --key sets the ordering key (the user property key); N
publishes of one key are delivered in order. Exits 1 when the broker
refused one.

  shardq pub '$queue/orders' --message hello --key customer-7 --count 3
`

const subUsage = `usage: shardq sub FILTER [--count N] [--settle ack|nack|reject|release|none] [flags]

Subscribes to FILTER over MQTT 5 at QoS 1 and prints each message it gets:
topic, msg-id, key, delivery count, DUP, payload. A queue delivery
($queue/NAME, $share/GROUP/$queue/NAME) is settled as --settle says:
ack (the default, by the PUBACK), or, subscribing with ack=explicit, by
publishing to $queue/NAME/$nack, $reject or $release, or not at all
(none: it stays leased until its ack_timeout). Stops after N messages
(0: until interrupted) or --wait without one.

  shardq sub '$share/billing/$queue/orders' --count 1 --settle nack
`

// mqttFlags are the connection flags of pub and sub.
type mqttFlags struct {
	broker, user, password, clientID string
	timeout                          time.Duration
	inflight                         int // Receive Maximum; 0: the client's default
}

func (m *mqttFlags) add(c *command) {
	c.flags.StringVar(&m.broker, "broker", "127.0.0.1:1883", "the broker's MQTT `HOST:PORT`")
	c.env["broker"] = "SHARDQ_BROKER"
	c.flags.StringVar(&m.user, "username", "", "the MQTT `USER`, when the broker has users")
	c.flags.StringVar(&m.password, "password", "", "its `PASSWORD`")
	c.env["password"] = "SHARDQ_PASSWORD"
	c.flags.StringVar(&m.clientID, "client-id", "", "the client `ID` (default shardq-pub-PID or shardq-sub-PID)")
	c.flags.DurationVar(&m.timeout, "timeout", 10*time.Second, "how long to wait for the broker's answers")
}

// connect opens an MQTT 5 connection; onPublish gets what arrives.
func (m *mqttFlags) connect(ctx context.Context, id string, manual bool, onPublish func(paho.PublishReceived) (bool, error)) (*paho.Client, error) {
	if m.clientID != "" {
		id = m.clientID
	}
	d := net.Dialer{Timeout: m.timeout}
	conn, err := d.DialContext(ctx, "tcp", strings.TrimPrefix(m.broker, "mqtt://"))
	if err != nil {
		return nil, fmt.Errorf("connecting to %s: %w (is the broker's MQTT listener there? --broker HOST:PORT)", m.broker, err)
	}
	cfg := paho.ClientConfig{Conn: conn, ClientID: id, EnableManualAcknowledgment: manual}
	if onPublish != nil {
		cfg.OnPublishReceived = []func(paho.PublishReceived) (bool, error){onPublish}
	}
	cl := paho.NewClient(cfg)
	cp := &paho.Connect{ClientID: id, CleanStart: true, KeepAlive: 30}
	if m.inflight > 0 {
		// No more sent ahead than will be taken.
		rm := uint16(min(m.inflight, 65535))
		cp.Properties = &paho.ConnectProperties{ReceiveMaximum: &rm}
	}
	if m.user != "" {
		cp.Username, cp.UsernameFlag = m.user, true
		cp.Password, cp.PasswordFlag = []byte(m.password), m.password != ""
	}
	cctx, cancel := context.WithTimeout(ctx, m.timeout)
	defer cancel()
	ca, err := cl.Connect(cctx, cp)
	if err != nil {
		if ca != nil {
			return nil, fmt.Errorf("the broker refused the connection: %s", reason(ca.ReasonCode, ca.Properties.ReasonString))
		}
		return nil, fmt.Errorf("connecting to %s: %w", m.broker, err)
	}
	return cl, nil
}

// reason names a reason code with the broker's reason string.
func reason(code byte, why string) string {
	s := fmt.Sprintf("0x%02x", code)
	if why != "" {
		s += " (" + why + ")"
	}
	return s
}

// pubCommand runs shardq pub.
func pubCommand(ctx context.Context, args []string, stdout, stderr io.Writer, getenv func(string) string) int {
	c := newCommand("pub", pubUsage)
	var m mqttFlags
	m.add(c)
	message := c.flags.String("message", "", "the payload `TEXT`")
	key := c.flags.String("key", "", "the ordering `KEY` of a queue message (user property key)")
	count := c.flags.Int("count", 1, "publish `N` times; a count goes after TEXT when N > 1")
	pos, code := c.parseOne(args, "TOPIC", getenv, stdout, stderr)
	switch {
	case code >= 0:
		return code
	case *count < 1:
		return c.fail(stderr, "--count must be at least 1, got %d", *count)
	}
	cl, err := m.connect(ctx, "shardq-pub-"+strconv.Itoa(os.Getpid()), false, nil)
	if err != nil {
		fmt.Fprintf(stderr, "shardq pub: %v\n", err)
		return 1
	}
	defer func() { _ = cl.Disconnect(&paho.Disconnect{}) }()
	refused := 0
	for i := 1; i <= *count; i++ {
		payload := *message
		if *count > 1 {
			payload += " " + strconv.Itoa(i)
		}
		p := &paho.Publish{Topic: pos[0], QoS: 1, Payload: []byte(payload)}
		if *key != "" {
			p.Properties = &paho.PublishProperties{User: paho.UserProperties{{Key: "key", Value: *key}}}
		}
		pctx, cancel := context.WithTimeout(ctx, m.timeout)
		res, err := cl.Publish(pctx, p)
		cancel()
		switch {
		case res != nil && res.ReasonCode >= 0x80:
			refused++
			why := ""
			if res.Properties != nil {
				why = res.Properties.ReasonString
			}
			fmt.Fprintf(stdout, "%q refused: %s\n", payload, reason(res.ReasonCode, why))
		case err != nil:
			fmt.Fprintf(stderr, "shardq pub: %v\n", err)
			return 1
		default:
			fmt.Fprintf(stdout, "%q stored (0x%02x)\n", payload, res.ReasonCode)
		}
	}
	if refused > 0 {
		return 1
	}
	return 0
}

// subCommand runs shardq sub.
func subCommand(ctx context.Context, args []string, stdout, stderr io.Writer, getenv func(string) string) int {
	c := newCommand("sub", subUsage)
	var m mqttFlags
	m.add(c)
	count := c.flags.Int("count", 0, "stop after `N` messages; 0: until interrupted")
	settle := c.flags.String("settle", "ack", "what to do with a queue delivery: `ack`, nack, reject, release or none")
	wait := c.flags.Duration("wait", 0, "stop when no message came for this `DURATION`; 0: never")
	pos, code := c.parseOne(args, "FILTER", getenv, stdout, stderr)
	if code >= 0 {
		return code
	}
	var f queue.Filter
	if queue.IsQueueTopic(pos[0]) {
		var err error
		if f, err = queue.ParseFilter(pos[0]); err != nil {
			return c.fail(stderr, "%v", err)
		}
	}
	verb := map[string]string{"ack": "", "nack": queue.VerbNack, "reject": queue.VerbReject, "release": queue.VerbRelease, "none": "-"}
	v, ok := verb[*settle]
	if !ok {
		return c.fail(stderr, "--settle %q: want ack, nack, reject, release or none", *settle)
	}
	explicit := v != "" && f.Queue != ""
	m.inflight = *count
	got := make(chan *paho.Publish, 1024)
	cl, err := m.connect(ctx, "shardq-sub-"+strconv.Itoa(os.Getpid()), explicit, func(r paho.PublishReceived) (bool, error) {
		got <- r.Packet
		return true, nil
	})
	if err != nil {
		fmt.Fprintf(stderr, "shardq sub: %v\n", err)
		return 1
	}
	defer func() { _ = cl.Disconnect(&paho.Disconnect{}) }()
	s := &paho.Subscribe{Subscriptions: []paho.SubscribeOptions{{Topic: pos[0], QoS: 1}}}
	if explicit {
		s.Properties = &paho.SubscribeProperties{User: paho.UserProperties{{Key: "ack", Value: "explicit"}}}
	}
	sctx, cancel := context.WithTimeout(ctx, m.timeout)
	sa, err := cl.Subscribe(sctx, s)
	cancel()
	if err != nil || len(sa.Reasons) != 1 || sa.Reasons[0] >= 0x80 {
		why := fmt.Sprint(err)
		if sa != nil && len(sa.Reasons) == 1 {
			rs := ""
			if sa.Properties != nil {
				rs = sa.Properties.ReasonString
			}
			why = "the broker refused it: " + reason(sa.Reasons[0], rs)
		}
		fmt.Fprintf(stderr, "shardq sub: subscribing to %s: %s\n", pos[0], why)
		return 1
	}
	var idle <-chan time.Time
	for n := 0; *count == 0 || n < *count; n++ {
		if *wait > 0 {
			idle = time.After(*wait)
		}
		var p *paho.Publish
		select {
		case <-ctx.Done():
			return 0
		case <-idle:
			fmt.Fprintf(stderr, "shardq sub: nothing for %s\n", *wait)
			return 1
		case p = <-got:
		}
		fmt.Fprintln(stdout, describe(p))
		if !explicit {
			continue
		}
		// The PUBACK says received; the settlement follows.
		if err := cl.Ack(p); err != nil {
			fmt.Fprintf(stderr, "shardq sub: %v\n", err)
			return 1
		}
		if v == "-" {
			continue
		}
		if code := settleExplicit(ctx, cl, &m, p, f, v, stdout); code != 0 {
			return code
		}
	}
	return 0
}

// settleExplicit publishes the settlement verb of delivery p.
// The group is the filter's: a settlement names it.
func settleExplicit(ctx context.Context, cl *paho.Client, m *mqttFlags, p *paho.Publish, f queue.Filter, verb string, stdout io.Writer) int {
	id := ""
	if p.Properties != nil {
		id = p.Properties.User.Get("msg-id")
	}
	if id == "" {
		fmt.Fprintln(stdout, "  no msg-id: nothing to settle")
		return 0
	}
	sp := &paho.Publish{Topic: queue.TopicName(f.Queue, verb), QoS: 1, Payload: []byte(id),
		Properties: &paho.PublishProperties{User: paho.UserProperties{{Key: "msg-id", Value: id}, {Key: "group", Value: f.Group}}}}
	pctx, cancel := context.WithTimeout(ctx, m.timeout)
	defer cancel()
	res, err := cl.Publish(pctx, sp)
	switch {
	case res != nil && res.ReasonCode >= 0x80:
		why := ""
		if res.Properties != nil {
			why = res.Properties.ReasonString
		}
		fmt.Fprintf(stdout, "  %s refused: %s\n", strings.TrimPrefix(verb, "$"), reason(res.ReasonCode, why))
	case err != nil:
		fmt.Fprintf(stdout, "  %s: %v\n", strings.TrimPrefix(verb, "$"), err)
		return 1
	default:
		fmt.Fprintf(stdout, "  %s\n", map[string]string{queue.VerbNack: "nacked", queue.VerbReject: "rejected", queue.VerbRelease: "released"}[verb])
	}
	return 0
}

// describe is one line about a message received.
func describe(p *paho.Publish) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s", p.Topic)
	if props := p.Properties; props != nil {
		for _, k := range []string{"msg-id", "key", "delivery-count"} {
			if v := props.User.Get(k); v != "" {
				fmt.Fprintf(&b, " %s=%s", k, v)
			}
		}
	}
	if p.Duplicate() {
		b.WriteString(" dup")
	}
	fmt.Fprintf(&b, " %q", p.Payload)
	return b.String()
}
