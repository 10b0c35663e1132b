package cluster_test

import (
	"context"
	"fmt"
	"maps"
	"math/rand/v2"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/eclipse/paho.golang/paho"

	hist "github.com/shardq/shardq/internal/history"
)

// The load of a fault test: a producer and a consumer of group g on each
// node, through real MQTT 5 connections. Producers publish to
// $queue/orders with a key user property, each payload a unique message
// id, one publish at a time per key and every key at once; consumers
// hold each delivery a moment and acknowledge it. Everything each client
// saw goes into a Recorder of internal/history: publish attempts with
// their answers, deliveries with DUP, msg-id and delivery-count,
// settlements and disconnects.
//
// A client that loses its connection (or whose publish got no answer)
// connects again, to its own node first, skipping the nodes a fault cut
// off; rehome brings the clients back to their own nodes afterwards.

const (
	loadQueue = "orders"
	loadTopic = "$queue/" + loadQueue
	loadGroup = "g"
	// publishTimeout bounds the wait for a PUBACK: past it the publish
	// has no answer (shardq answers 0x83 within 5 s without a quorum).
	publishTimeout = 8 * time.Second
	// publishAttempts: a publish whose outcome is unknown (no answer,
	// 0x83) is tried again, with the same id, up to this many times.
	publishAttempts = 3
	// retryAfter is the pause before such a retry.
	retryAfter = 100 * time.Millisecond
	keepAlive  = 5 // seconds
)

// workload is the producers and consumers of one history.
type workload struct {
	c      *testCluster
	rec    *hist.Recorder
	nodes  []string
	prefix string // every message id of this history starts with it
	keys   int
	rate   int // publishes per second, over every producer

	stop      chan struct{} // closed: the producers stop
	wg        sync.WaitGroup
	cwg       sync.WaitGroup
	producers []*producer
	consumers []*consumer

	mu sync.Mutex
	// Guarded by mu.
	avoid    map[string]bool // nodes a fault cut off: clients connect elsewhere
	acked    map[string]bool // ids acknowledged
	got      map[string]bool // ids delivered to the group
	lastGot  time.Time
	parts    map[string]int // key -> partition, as deliveries say
	earlier  int            // deliveries of messages of an earlier history
	stopping bool           // consumers stop
}

func newWorkload(c *testCluster, nodes []string, prefix string, keys, rate int) *workload {
	return &workload{c: c, rec: &hist.Recorder{}, nodes: nodes, prefix: prefix, keys: keys, rate: rate,
		stop: make(chan struct{}), avoid: map[string]bool{}, acked: map[string]bool{}, got: map[string]bool{},
		parts: map[string]int{}}
}

// start runs a consumer and a producer on every node, once a first
// message went through a's producer, so that the queue exists before the
// others use it.
func (w *workload) start() error {
	for _, id := range w.nodes {
		w.producers = append(w.producers, &producer{w: w, name: "p-" + id, home: id})
	}
	first := w.producers[0]
	deadline := time.Now().Add(30 * time.Second)
	for {
		id := fmt.Sprintf("%s%s-%d", w.prefix, first.name, first.seq.Add(1))
		if p := first.publish(id, "k0"); p.Answer == hist.Acked {
			break
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("no publish through %s acknowledged within 30s", first.home)
		}
		time.Sleep(100 * time.Millisecond)
	}
	for _, id := range w.nodes {
		c := &consumer{w: w, name: "c-" + id, home: id}
		w.consumers = append(w.consumers, c)
		w.cwg.Add(1)
		go c.run()
	}
	per := max(w.rate/len(w.producers), 1)
	for _, p := range w.producers {
		p.tick = time.NewTicker(time.Second / time.Duration(per))
		for k := range w.keys {
			w.wg.Add(1)
			go p.work("k"+strconv.Itoa(k), p.tick.C)
		}
	}
	return nil
}

// stopProducers stops publishing and waits for the publishes in flight.
func (w *workload) stopProducers() {
	close(w.stop)
	w.wg.Wait()
	for _, p := range w.producers {
		p.tick.Stop()
		p.mu.Lock()
		if p.cl != nil {
			closeLater(p.cl, 0)
			p.cl = nil
		}
		p.mu.Unlock()
	}
}

// stopConsumers disconnects the consumers and waits for them.
func (w *workload) stopConsumers() {
	w.mu.Lock()
	w.stopping = true
	w.mu.Unlock()
	for _, c := range w.consumers {
		c.end(nil)
	}
	w.cwg.Wait()
}

func (w *workload) stopped() bool {
	select {
	case <-w.stop:
		return true
	default:
		return false
	}
}

// pick returns the node a client whose node is home connects to at its
// attempt-th try: home, then the next ones, skipping the nodes cut off
// unless all are.
func (w *workload) pick(home string, attempt int) string {
	w.mu.Lock()
	defer w.mu.Unlock()
	var order, open []string
	at := 0
	for i, id := range w.nodes {
		if id == home {
			at = i
		}
	}
	for i := range w.nodes {
		id := w.nodes[(at+i)%len(w.nodes)]
		order = append(order, id)
		if !w.avoid[id] {
			open = append(open, id)
		}
	}
	if len(open) > 0 {
		order = open
	}
	return order[attempt%len(order)]
}

// cut marks nodes cut off by a fault about to start: clients connect
// elsewhere, and the consumers connected to them end their sessions now,
// at the fault's start (the broker may hand their deliveries to others
// from then on, before these clients notice anything).
func (w *workload) cut(nodes []string) {
	w.mu.Lock()
	for _, id := range nodes {
		w.avoid[id] = true
	}
	w.mu.Unlock()
	for _, c := range w.consumers {
		c.end(nodes)
	}
}

// uncut lets clients connect to every node again.
func (w *workload) uncut() {
	w.mu.Lock()
	clear(w.avoid)
	w.mu.Unlock()
}

// rehome moves the clients connected to another node than their own
// back to it.
func (w *workload) rehome() {
	for _, p := range w.producers {
		p.rehome()
	}
	for _, c := range w.consumers {
		c.mu.Lock()
		s := c.sess
		c.mu.Unlock()
		if s != nil && s.node != c.home {
			s.end()
		}
	}
}

// missing counts the acknowledged messages not delivered to the group.
func (w *workload) missing() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	n := 0
	for id := range w.acked {
		if !w.got[id] {
			n++
		}
	}
	return n
}

// drain waits until every acknowledged message was delivered to the
// group, or none was delivered for quiet; it returns how many are
// missing.
func (w *workload) drain(quiet time.Duration) int {
	start := time.Now()
	for {
		n := w.missing()
		w.mu.Lock()
		last := w.lastGot
		w.mu.Unlock()
		if n == 0 || time.Since(start) > quiet && time.Since(last) > quiet {
			return n
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// drainDLQ reads the dead-letter queue with a consumer of the group on
// node until nothing came for quiet, recording what it got.
func (w *workload) drainDLQ(node string, quiet time.Duration) error {
	c := &consumer{w: w, name: "dlq-" + node, home: node, dlq: true}
	s, err := c.connect(node, c.name)
	if err != nil {
		return err
	}
	for {
		time.Sleep(quiet / 4)
		s.mu.Lock()
		last := s.last
		s.mu.Unlock()
		if time.Since(last) > quiet {
			break
		}
	}
	s.end()
	return nil
}

// partitions returns the partition of each key, as deliveries said.
func (w *workload) partitions() map[string]int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return maps.Clone(w.parts)
}

// connectMQTT connects an MQTT 5 client to addr, or fails within a few
// seconds.
func connectMQTT(addr, id string, cfg paho.ClientConfig, receiveMax uint16) (*paho.Client, error) {
	conn, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		return nil, err
	}
	cfg.Conn, cfg.ClientID = conn, id
	cl := paho.NewClient(cfg)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	if _, err := cl.Connect(ctx, &paho.Connect{ClientID: id, CleanStart: true, KeepAlive: keepAlive,
		Properties: &paho.ConnectProperties{ReceiveMaximum: &receiveMax}}); err != nil {
		_ = conn.Close()
		return nil, err
	}
	return cl, nil
}

// closeLater disconnects cl after a while (publishes in flight on it
// finish first), without blocking.
func closeLater(cl *paho.Client, after time.Duration) {
	time.AfterFunc(after, func() { _ = cl.Disconnect(&paho.Disconnect{}) })
}

// producer is one node's producer: a logical client that reconnects
// (with a new client id each time) when its connection fails.
type producer struct {
	w    *workload
	name string
	home string
	seq  atomic.Int64
	tick *time.Ticker
	// lastAck is when a publish of it was last acknowledged (unix nanos).
	lastAck atomic.Int64

	mu sync.Mutex // held while connecting
	// Guarded by mu.
	cl    *paho.Client
	node  string
	conns int
	tries int
}

// work publishes a new message of key at a tick, once the one before
// was answered, until the load stops. Each key has its own, so that a
// partition that stalls holds up only its keys.
func (p *producer) work(key string, tick <-chan time.Time) {
	defer p.w.wg.Done()
	for {
		select {
		case <-p.w.stop:
			return
		case <-tick:
		}
		id := fmt.Sprintf("%s%s-%d", p.w.prefix, p.name, p.seq.Add(1))
		for attempt := 1; attempt <= publishAttempts && !p.w.stopped(); attempt++ {
			if attempt > 1 {
				time.Sleep(retryAfter)
			}
			if !p.publish(id, key).Unknown() {
				break
			}
		}
	}
}

// publish makes one attempt to publish message id and records it.
func (p *producer) publish(id, key string) hist.Publish {
	cl, node := p.connection()
	if cl == nil {
		return hist.Publish{Answer: hist.Refused} // stopped
	}
	pub := hist.Publish{ID: id, Key: key, Queue: loadQueue, Node: node, Producer: p.name, Sent: time.Now()}
	ctx, cancel := context.WithTimeout(context.Background(), publishTimeout)
	resp, err := cl.Publish(ctx, &paho.Publish{Topic: loadTopic, QoS: 1, Payload: []byte(id),
		Properties: &paho.PublishProperties{User: paho.UserProperties{{Key: "key", Value: key}}}})
	cancel()
	switch {
	case resp != nil && resp.ReasonCode == 0:
		pub.Answered, pub.Answer = time.Now(), hist.Acked
	case resp != nil:
		pub.Answered, pub.Answer, pub.Code = time.Now(), hist.Refused, resp.ReasonCode
	default:
		_ = err // no answer: the connection is suspect
		p.drop(cl)
	}
	p.w.rec.Publish(pub)
	if pub.Answer == hist.Acked {
		p.lastAck.Store(pub.Answered.UnixNano())
		p.w.mu.Lock()
		p.w.acked[id] = true
		p.w.mu.Unlock()
	}
	return pub
}

// connection returns the producer's connection and its node, connecting
// first if it has none; nil once the load stopped.
func (p *producer) connection() (*paho.Client, string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for p.cl == nil {
		if p.w.stopped() {
			return nil, ""
		}
		node := p.w.pick(p.home, p.tries)
		p.conns++
		cl, err := connectMQTT(p.w.c.nodes[node].mqtt, p.name+"."+strconv.Itoa(p.conns), paho.ClientConfig{}, 64)
		if err != nil {
			p.tries++
			time.Sleep(100 * time.Millisecond)
			continue
		}
		p.cl, p.node, p.tries = cl, node, 0
	}
	return p.cl, p.node
}

// drop closes cl if it is still the producer's connection.
func (p *producer) drop(cl *paho.Client) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cl == cl {
		p.cl = nil
		closeLater(cl, 0)
	}
}

// rehome makes the next publish connect to the producer's own node,
// when it is on another; the publishes in flight finish on the old
// connection.
func (p *producer) rehome() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cl != nil && p.node != p.home {
		closeLater(p.cl, publishTimeout+time.Second)
		p.cl = nil
	}
}

// consumer is one node's consumer of the group: a logical client that
// reconnects (with a new client id each time) when its session ends.
type consumer struct {
	w    *workload
	name string
	home string
	dlq  bool // reads the dead-letter queue

	mu   sync.Mutex
	sess *session // guarded by mu
}

// session is one connection of a consumer.
type session struct {
	w     *workload
	id    string
	node  string
	dlq   bool
	cl    *paho.Client
	ended chan struct{}

	mu sync.Mutex
	// Guarded by mu.
	closed bool
	last   time.Time // of the last delivery
}

func (c *consumer) run() {
	defer c.w.cwg.Done()
	tries := 0
	for n := 1; ; n++ {
		c.w.mu.Lock()
		stopping := c.w.stopping
		c.w.mu.Unlock()
		if stopping {
			return
		}
		s, err := c.connect(c.w.pick(c.home, tries), c.name+"."+strconv.Itoa(n))
		if err != nil {
			tries++
			time.Sleep(100 * time.Millisecond)
			continue
		}
		tries = 0
		c.mu.Lock()
		c.sess = s
		c.mu.Unlock()
		// A stop or a cut that came while it connected missed it.
		c.w.mu.Lock()
		gone := c.w.stopping || c.w.avoid[s.node]
		c.w.mu.Unlock()
		if gone {
			s.end()
		}
		select {
		case <-s.cl.Done():
		case <-s.ended:
		}
		s.end()
	}
}

// end ends the consumer's session when it is on one of nodes, or
// whatever its node with nodes nil.
func (c *consumer) end(nodes []string) {
	c.mu.Lock()
	s := c.sess
	c.mu.Unlock()
	if s == nil {
		return
	}
	for _, id := range nodes {
		if s.node == id {
			s.end()
			return
		}
	}
	if nodes == nil {
		s.end()
	}
}

// connect opens a session of the consumer on node and subscribes.
func (c *consumer) connect(node, id string) (*session, error) {
	s := &session{w: c.w, id: id, node: node, dlq: c.dlq, ended: make(chan struct{}), last: time.Now()}
	cl, err := connectMQTT(c.w.c.nodes[node].mqtt, id, paho.ClientConfig{
		EnableManualAcknowledgment: true,
		SendAcksInterval:           5 * time.Millisecond,
		OnPublishReceived:          []func(paho.PublishReceived) (bool, error){s.received},
	}, 32)
	if err != nil {
		return nil, err
	}
	s.cl = cl
	filter := "$share/" + loadGroup + "/" + loadTopic
	if c.dlq {
		filter += "/$dlq"
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	sa, err := cl.Subscribe(ctx, &paho.Subscribe{Subscriptions: []paho.SubscribeOptions{{Topic: filter, QoS: 1}}})
	if err == nil && (len(sa.Reasons) != 1 || sa.Reasons[0] > 1) {
		err = fmt.Errorf("subscribe %s: reasons %v", filter, sa.Reasons)
	}
	if err != nil {
		s.end()
		return nil, err
	}
	return s, nil
}

// received records a delivery and acknowledges it after a moment: a few
// milliseconds mostly, now and then a few hundred.
func (s *session) received(r paho.PublishReceived) (bool, error) {
	p := r.Packet
	d := hist.Delivery{ID: string(p.Payload), Key: userProp(p, "key"), Group: loadGroup, Consumer: s.id,
		Node: s.node, At: time.Now(), DUP: p.Duplicate(), MsgID: userProp(p, "msg-id"), DLQ: s.dlq}
	d.DeliveryCount, _ = strconv.Atoi(userProp(p, "delivery-count"))
	if s.dlq {
		d.OriginalMsgID = userProp(p, "original-msg-id")
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return true, nil
	}
	s.last = d.At
	s.w.delivered(d, userProp(p, "partition"))
	hold := time.Duration(rand.IntN(5)) * time.Millisecond
	if rand.IntN(100) < 3 {
		hold = time.Duration(100+rand.IntN(200)) * time.Millisecond
	}
	time.AfterFunc(hold, func() {
		s.mu.Lock()
		defer s.mu.Unlock()
		if s.closed {
			return
		}
		if strings.HasPrefix(d.ID, s.w.prefix) {
			s.w.rec.Settle(hist.Settlement{ID: d.ID, Group: d.Group, Consumer: s.id, MsgID: d.MsgID, DLQ: d.DLQ,
				At: time.Now(), Outcome: hist.Ack})
		}
		_ = s.cl.Ack(p)
	})
	return true, nil
}

// delivered notes a delivery: recorded when it is of this history.
func (w *workload) delivered(d hist.Delivery, partition string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !strings.HasPrefix(d.ID, w.prefix) {
		w.earlier++
		return
	}
	w.rec.Deliver(d)
	if d.DLQ {
		return
	}
	w.got[d.ID] = true
	w.lastGot = d.At
	if p, err := strconv.Atoi(partition); err == nil {
		w.parts[d.Key] = p
	}
}

// end records the session's end, once, and closes its connection: the
// deliveries it held are no longer its own from now on.
func (s *session) end() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return
	}
	s.closed = true
	s.w.rec.Disconnect(hist.Disconnect{Client: s.id, Node: s.node, At: time.Now()})
	close(s.ended)
	if s.cl != nil {
		closeLater(s.cl, 0)
	}
}
