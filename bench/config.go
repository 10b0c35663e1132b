package bench

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net"
	"strings"
	"time"
)

// Scenario names a load shape.
type Scenario string

// The scenarios; see the package documentation.
const (
	ScenarioPubSub  Scenario = "pubsub"
	ScenarioProduce Scenario = "produce"
	ScenarioCycle   Scenario = "cycle"
	ScenarioFanIn   Scenario = "fanin"
	ScenarioBacklog Scenario = "backlog"
)

// Scenarios lists every scenario in the order the usage text shows them.
var Scenarios = []Scenario{ScenarioPubSub, ScenarioProduce, ScenarioCycle, ScenarioFanIn, ScenarioBacklog}

// consumes reports whether the scenario has consumers.
func (s Scenario) consumes() bool { return s != ScenarioProduce }

// FanInProducers is the producer count of the fanin scenario when none is
// given.
const FanInProducers = 64

// Config is one benchmark run against one broker.
type Config struct {
	// Usually set.

	// Scenario is the load shape.
	Scenario Scenario `yaml:"scenario"`
	// Broker is the MQTT TCP address, HOST:PORT; a comma-separated list
	// spreads the producers over the nodes of a cluster, in turn.
	Broker string `yaml:"broker"`
	// ConsumeBroker, when set, is where the consumers connect (a
	// comma-separated list: in turn); default Broker.
	ConsumeBroker string `yaml:"consume_broker"`
	// Producers is the number of producer connections.
	Producers int `yaml:"producers"`
	// Consumers is the number of consumer connections. With more than one,
	// they share one subscription group.
	Consumers int `yaml:"consumers"`
	// Size is the payload size in bytes, at least HeaderSize.
	Size int `yaml:"size"`
	// QoS of publishes and subscriptions.
	QoS byte `yaml:"qos"`
	// Window is the number of unacknowledged publishes a producer keeps in
	// flight. QoS 0 publishes are never acknowledged: the window does not
	// hold them back, only Rate does.
	Window int `yaml:"window"`
	// Rate is the total publish rate over all producers in messages per
	// second; 0 publishes as fast as the window allows.
	Rate float64 `yaml:"rate"`
	// Duration is how long producers publish after the warm-up. 0: until
	// Messages are sent.
	Duration time.Duration `yaml:"duration"`
	// Warmup is published before the measurement starts; its messages are
	// checked for loss but excluded from throughput and latency.
	Warmup time.Duration `yaml:"warmup"`
	// Messages is the total number of messages to publish over all
	// producers; 0 publishes for Duration. Whichever ends first stops the
	// producers. backlog fills exactly this many when set.
	Messages int `yaml:"messages"`
	// Keys is the number of distinct `key` user properties over all
	// producers.
	Keys int `yaml:"keys"`
	// OrderingCheck makes a run with any per-key reordering invalid, for
	// brokers that promise per-key order (shardq's default `key` ordering).
	OrderingCheck bool `yaml:"ordering_check"`

	// Fine tuning.

	// Drain bounds the wait, after producers stop, for acknowledged
	// messages still in flight to the consumers. In backlog it is the idle
	// bound: draining stops when nothing arrived for this long.
	Drain time.Duration `yaml:"drain"`
	// ConnectTimeout bounds each dial, CONNECT and SUBSCRIBE.
	ConnectTimeout time.Duration `yaml:"connect_timeout"`
	// AckInterval is how often consumers flush their PUBACKs (acks are
	// sent in order, in batches; paho's default is 50ms).
	AckInterval time.Duration `yaml:"ack_interval"`
	// ReceiveMaximum is the consumers' v5 Receive Maximum; 0 leaves it out
	// (65535).
	ReceiveMaximum uint16 `yaml:"receive_maximum"`
	// ConsumerClient is the MQTT client the consumers use: ClientLean (the
	// default, a minimal MQTT 5 client of this package) or ClientPaho311
	// (paho.mqtt.golang speaking MQTT 3.1.1, as many applications do: no
	// Receive Maximum, one PUBACK per message as its handler returns).
	ConsumerClient string `yaml:"consumer_client"`
	// BrokerPID, when not 0, is the broker's process id: its resident set
	// size is read from /proc and reported.
	BrokerPID int `yaml:"broker_pid"`
	// RunID names the run's topics and client ids; empty picks a random one.
	RunID string `yaml:"run_id"`
	// Subject, for the queue scenarios, is the subject the producers
	// publish under ($queue/bench-{run}/{subject}); Filter the subject
	// filter the consumers' group subscribes with
	// ($share/bench/$queue/bench-{run}/{filter}). Empty: none.
	Subject string `yaml:"subject"`
	Filter  string `yaml:"filter"`
	// ProgressInterval is how often Progress is called.
	ProgressInterval time.Duration `yaml:"progress_interval"`
	// Progress, when set, is called every ProgressInterval while the run
	// lasts, from a goroutine of its own.
	Progress func(Progress) `yaml:"-"`
}

// Progress is a running snapshot, passed to Config.Progress.
type Progress struct {
	Elapsed     time.Duration
	SendRate    float64       // publishes per second over the last interval
	ReceiveRate float64       // first deliveries per second over the last interval
	P99         time.Duration // so far: end-to-end, or PUBACK in produce
	Sent        int64
	Received    int64
}

// DefaultConfig is the pubsub scenario with the documented defaults and no
// broker.
func DefaultConfig() Config {
	return Config{
		Scenario:         ScenarioPubSub,
		Producers:        4,
		Consumers:        1,
		Size:             64,
		QoS:              1,
		Window:           64,
		Duration:         10 * time.Second,
		Warmup:           2 * time.Second,
		Keys:             64,
		Drain:            10 * time.Second,
		ConnectTimeout:   10 * time.Second,
		AckInterval:      time.Millisecond,
		ProgressInterval: time.Second,
	}
}

// Validate reports the first invalid field.
func (c Config) Validate() error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: "+format, append([]any{ErrInvalidConfig}, args...)...)
	}
	switch {
	case !c.Scenario.valid():
		return bad("scenario %q: want one of %v", c.Scenario, Scenarios)
	case c.Broker == "":
		return bad("broker: empty address")
	case !validHostPorts(c.Broker):
		return bad("broker %q: want HOST:PORT[,HOST:PORT...]", c.Broker)
	case c.ConsumeBroker != "" && !validHostPorts(c.ConsumeBroker):
		return bad("consume-broker %q: want HOST:PORT[,HOST:PORT...]", c.ConsumeBroker)
	case c.Producers < 1:
		return bad("producers %d: want at least 1", c.Producers)
	case c.Scenario.consumes() && c.Consumers < 1:
		return bad("consumers %d: want at least 1", c.Consumers)
	case c.Size < HeaderSize:
		return bad("size %d: want at least %d (the header)", c.Size, HeaderSize)
	case c.QoS > 2:
		return bad("qos %d: want 0, 1 or 2", c.QoS)
	case c.Window < 1:
		return bad("window %d: want at least 1", c.Window)
	case c.Rate < 0:
		return bad("rate %g: want 0 (saturation) or more", c.Rate)
	case c.Duration < 0, c.Warmup < 0:
		return bad("duration and warmup must not be negative")
	case c.Messages < 0:
		return bad("messages %d: want 0 (unbounded) or more", c.Messages)
	case c.Duration == 0 && c.Messages == 0:
		return bad("duration and messages are both 0: the run would not end")
	case c.Keys < 1:
		return bad("keys %d: want at least 1", c.Keys)
	case c.Drain <= 0:
		return bad("drain %v: want more than 0", c.Drain)
	case c.ConnectTimeout <= 0:
		return bad("connect timeout %v: want more than 0", c.ConnectTimeout)
	case c.ConsumerClient != "" && c.ConsumerClient != ClientLean && c.ConsumerClient != ClientPaho311:
		return bad("consumer client %q: want %s or %s", c.ConsumerClient, ClientLean, ClientPaho311)
	case c.ConsumerClient == ClientPaho311 && c.QoS == 2:
		return bad("consumer client %s: QoS 2 is not measured with it; use qos 0 or 1", ClientPaho311)
	case c.AckInterval <= 0:
		return bad("ack interval %v: want more than 0", c.AckInterval)
	case c.Progress != nil && c.ProgressInterval <= 0:
		return bad("progress interval %v: want more than 0", c.ProgressInterval)
	case len(c.RunID) > 64:
		return bad("run id: longer than 64 characters")
	}
	for _, r := range c.RunID {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-' || r == '_' || r == '.') {
			return bad("run id %q: only A-Z a-z 0-9 _ . - allowed", c.RunID)
		}
	}
	return nil
}

func validHostPort(addr string) bool {
	_, port, err := net.SplitHostPort(addr)
	return err == nil && port != ""
}

func (s Scenario) valid() bool {
	for _, k := range Scenarios {
		if s == k {
			return true
		}
	}
	return false
}

// topics are the names one run publishes and subscribes to.
type topics struct {
	publish   string
	subscribe string // empty when the scenario has no consumers
}

// topicsFor names the topics of a run.
//
//	pubsub:                bench/{run}, shared as $share/bench/bench/{run} with several consumers
//	produce:               $queue/bench-{run}, no consumer
//	cycle, fanin, backlog: $queue/bench-{run}, consumed as $share/bench/$queue/bench-{run}
func topicsFor(s Scenario, run string, consumers int, subject, filter string) topics {
	switch s {
	case ScenarioPubSub:
		t := topics{publish: "bench/" + run, subscribe: "bench/" + run}
		if consumers > 1 {
			t.subscribe = "$share/bench/" + t.publish
		}
		return t
	case ScenarioProduce:
		return topics{publish: withLevels("$queue/bench-"+run, subject)}
	default:
		q := "$queue/bench-" + run
		return topics{publish: withLevels(q, subject), subscribe: "$share/bench/" + withLevels(q, filter)}
	}
}

// withLevels appends the levels of sub to topic, if any.
func withLevels(topic, sub string) string {
	if sub == "" {
		return topic
	}
	return topic + "/" + sub
}

// newRunID returns 8 random hex characters.
func newRunID() string {
	var b [4]byte
	_, _ = rand.Read(b[:]) // never fails (crypto/rand panics instead)
	return hex.EncodeToString(b[:])
}

// validHostPorts reports whether list is HOST:PORT items separated by commas.
func validHostPorts(list string) bool {
	for _, a := range strings.Split(list, ",") {
		if !validHostPort(a) {
			return false
		}
	}
	return true
}

// producerAddr is the address producer i connects to.
func (c *Config) producerAddr(i int) string {
	addrs := strings.Split(c.Broker, ",")
	return addrs[i%len(addrs)]
}

// consumerAddr is the address consumer i connects to.
func (c *Config) consumerAddr(i int) string {
	list := c.ConsumeBroker
	if list == "" {
		list = c.Broker
	}
	addrs := strings.Split(list, ",")
	return addrs[i%len(addrs)]
}
