package bench

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"math"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Run runs one scenario against cfg.Broker and returns its result. An error
// means the run could not be carried out (bad config, unreachable broker,
// lost connection, ctx ended); a broker that loses or reorders messages
// still yields a Result, with Valid false.
func Run(ctx context.Context, cfg Config) (*Result, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	r := &runner{cfg: cfg, run: cfg.RunID}
	if r.run == "" {
		r.run = newRunID()
	}
	r.topics = topicsFor(cfg.Scenario, r.run, cfg.Consumers, cfg.Subject, cfg.Filter)
	r.ledger = NewLedger(cfg.Producers)
	r.meter = newMeter(cfg.Scenario == ScenarioProduce)
	if cfg.Scenario == ScenarioBacklog {
		return r.backlog(ctx)
	}
	return r.steady(ctx)
}

// runner holds the state of one Run.
type runner struct {
	cfg    Config
	run    string
	topics topics
	ledger *Ledger
	meter  *meter
}

// steady runs pubsub, produce, cycle and fanin: consumers first, then
// producers for warm-up plus duration (or until Messages are sent), then a
// bounded drain.
func (r *runner) steady(ctx context.Context) (*Result, error) {
	var consumers []*consumer
	if r.cfg.Scenario.consumes() {
		cs, err := r.dialConsumers(ctx)
		if err != nil {
			return nil, err
		}
		consumers = cs
		defer closeAll(consumers, (*consumer).close)
	}
	producers, err := r.dialProducers(ctx)
	if err != nil {
		return nil, err
	}
	defer closeAll(producers, (*producer).close)

	start := time.Now()
	from := start.Add(r.cfg.Warmup)
	var to time.Time
	if r.cfg.Duration > 0 {
		to = from.Add(r.cfg.Duration)
	}
	r.meter.setWindow(from, to)
	stopProgress := r.startProgress(start)
	defer stopProgress()
	cpu := r.watchCPU(ctx, from, to)

	stop, cancel := ctx, context.CancelFunc(func() {})
	if !to.IsZero() {
		stop, cancel = context.WithDeadline(ctx, to)
	}
	defer cancel()
	if err := r.produceAll(ctx, stop, producers); err != nil {
		return nil, err
	}
	// The window ends at the deadline, unless every message was sent
	// before it: then at the last counted event.
	timeBound := !to.IsZero() && (r.cfg.Messages == 0 || r.ledger.SentCount() < int64(r.cfg.Messages))

	drained := true
	if r.cfg.Scenario.consumes() {
		dctx, dcancel := context.WithTimeout(ctx, r.cfg.Drain)
		werr := r.ledger.Wait(dctx)
		dcancel()
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		drained = werr == nil
		if err := firstLost(consumers); err != nil {
			return nil, err
		}
	}
	stopProgress()

	end := r.meter.lastEvent()
	if timeBound {
		end = to
	}
	res := r.result(producers, r.meter.measured.Load(), end.Sub(from))
	res.Drained = drained
	// A run that sent its Messages before the window ended has no
	// reading at the end of it: its CPU is not reported, and not waited
	// for.
	if !timeBound {
		return res, nil
	}
	if used, ok := cpu(); ok && res.Measured > 0 {
		res.BrokerCPUUsPerMsg = float64(used.Microseconds()) / float64(res.Measured)
		res.BrokerCores = used.Seconds() / to.Sub(from).Seconds()
	}
	return res, nil
}

// backlog fills the queue with no consumer, then starts the consumers and
// drains it. The fill stops after Messages (or Duration); the drain ends
// when every acknowledged message arrived or nothing arrived for Drain.
func (r *runner) backlog(ctx context.Context) (*Result, error) {
	producers, err := r.dialProducers(ctx)
	if err != nil {
		return nil, err
	}
	fillStart := time.Now()
	r.meter.setWindow(fillStart, time.Time{})
	stopProgress := r.startProgress(fillStart)
	defer stopProgress()

	stop, cancel := ctx, context.CancelFunc(func() {})
	if r.cfg.Duration > 0 {
		stop, cancel = context.WithTimeout(ctx, r.cfg.Duration)
	}
	err = r.produceAll(ctx, stop, producers)
	cancel()
	fillEnd := time.Now()
	closeAll(producers, (*producer).close)
	if err != nil {
		return nil, err
	}
	filled := r.ledger.Tally().Acked
	rssFill := r.readRSS()

	drainStart := time.Now()
	consumers, err := r.dialConsumers(ctx)
	if err != nil {
		return nil, err
	}
	defer closeAll(consumers, (*consumer).close)
	drained, err := r.drainIdle(ctx)
	if err != nil {
		return nil, err
	}
	if err := firstLost(consumers); err != nil {
		return nil, err
	}
	stopProgress()

	drainEnd := r.meter.lastEvent()
	if drainEnd.Before(drainStart) {
		drainEnd = drainStart
	}
	received := r.ledger.ReceivedCount()
	res := r.result(producers, received, drainEnd.Sub(drainStart))
	res.Drained = drained
	res.FillMsgsPerS = rate(filled, fillEnd.Sub(fillStart))
	res.DrainMsgsPerS = rate(received, drainEnd.Sub(drainStart))
	res.RSSAfterFillKB = rssFill.rss
	return res, nil
}

// drainIdle waits until every acknowledged message arrived (true), or a
// whole Drain period passed without any arrival (false).
func (r *runner) drainIdle(ctx context.Context) (bool, error) {
	for {
		before := r.ledger.ReceivedCount()
		dctx, cancel := context.WithTimeout(ctx, r.cfg.Drain)
		err := r.ledger.Wait(dctx)
		cancel()
		switch {
		case err == nil:
			return true, nil
		case ctx.Err() != nil:
			return false, ctx.Err()
		case r.ledger.ReceivedCount() == before:
			return false, nil
		}
	}
}

func (r *runner) dialProducers(ctx context.Context) ([]*producer, error) {
	ps := make([]*producer, 0, r.cfg.Producers)
	for i := range r.cfg.Producers {
		p, err := dialProducer(ctx, &r.cfg, uint32(i), r.run, r.topics.publish, r.ledger, r.meter)
		if err != nil {
			closeAll(ps, (*producer).close)
			return nil, err
		}
		ps = append(ps, p)
	}
	return ps, nil
}

func (r *runner) dialConsumers(ctx context.Context) ([]*consumer, error) {
	cs := make([]*consumer, 0, r.cfg.Consumers)
	for i := range r.cfg.Consumers {
		c, err := dialConsumer(ctx, &r.cfg, i, r.run, r.topics.subscribe, r.ledger, r.meter)
		if err != nil {
			closeAll(cs, (*consumer).close)
			return nil, err
		}
		cs = append(cs, c)
	}
	return cs, nil
}

// produceAll runs every producer until stop ends or its share of Messages
// is sent, then waits (up to Drain) for its acknowledgements.
func (r *runner) produceAll(ctx, stop context.Context, producers []*producer) error {
	total := uint64(r.cfg.Messages)
	n := uint64(len(producers))
	errs := make([]error, len(producers))
	var wg sync.WaitGroup
	for i, p := range producers {
		var count uint64
		if total > 0 {
			count = total / n
			if uint64(i) < total%n {
				count++
			}
			if count == 0 {
				continue // fewer messages than producers
			}
		}
		wg.Go(func() {
			if err := p.produce(ctx, stop, count); err != nil {
				errs[i] = err
				return
			}
			fctx, cancel := context.WithTimeout(ctx, r.cfg.Drain)
			defer cancel()
			errs[i] = p.flush(fctx)
		})
	}
	wg.Wait()
	if ctx.Err() != nil {
		return ctx.Err()
	}
	return errors.Join(errs...)
}

// startProgress calls cfg.Progress every ProgressInterval until the
// returned stop is called. stop may be called more than once.
func (r *runner) startProgress(start time.Time) (stop func()) {
	if r.cfg.Progress == nil {
		return func() {}
	}
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		t := time.NewTicker(r.cfg.ProgressInterval)
		defer t.Stop()
		last, lastSent, lastRecv := start, int64(0), int64(0)
		for {
			select {
			case <-done:
				return
			case now := <-t.C:
				sent, recv := r.ledger.SentCount(), r.ledger.ReceivedCount()
				secs := now.Sub(last).Seconds()
				p99 := r.meter.e2e.Percentile(99)
				if !r.cfg.Scenario.consumes() {
					p99 = r.meter.puback.Percentile(99)
				}
				r.cfg.Progress(Progress{
					Elapsed:     now.Sub(start),
					SendRate:    float64(sent-lastSent) / secs,
					ReceiveRate: float64(recv-lastRecv) / secs,
					P99:         p99,
					Sent:        sent,
					Received:    recv,
				})
				last, lastSent, lastRecv = now, sent, recv
			}
		}
	})
	var once sync.Once
	return func() {
		once.Do(func() { close(done) })
		wg.Wait()
	}
}

// result builds the Result of the run from the ledger and the meter.
func (r *runner) result(producers []*producer, measured int64, window time.Duration) *Result {
	t := r.ledger.Tally()
	if !r.cfg.Scenario.consumes() {
		t.Missing = 0 // nothing is supposed to arrive
	}
	res := &Result{
		Scenario:      string(r.cfg.Scenario),
		Broker:        r.cfg.Broker,
		RunID:         r.run,
		Producers:     r.cfg.Producers,
		Consumers:     r.cfg.Consumers,
		Size:          r.cfg.Size,
		QoS:           r.cfg.QoS,
		Window:        r.cfg.Window,
		Rate:          r.cfg.Rate,
		Keys:          r.cfg.Keys,
		Tally:         t,
		Unacked:       t.Unacked(),
		Measured:      measured,
		WindowSeconds: window.Seconds(),
	}
	if !r.cfg.Scenario.consumes() {
		res.Consumers = 0
	}
	res.setLatencies(r.meter.puback.Summary(), r.meter.e2e.Summary())
	if t.Missing > 0 {
		for _, id := range r.ledger.Missing(10) {
			res.MissingSample = append(res.MissingSample, id.String())
		}
	}
	for _, p := range producers {
		if c := p.lastReject.Load(); c != 0 {
			res.LastRejectReason = fmt.Sprintf("0x%02x", c)
		}
	}
	switch {
	case t.Missing > 0:
		res.Status = StatusLoss
	case r.cfg.OrderingCheck && t.Reordered > 0:
		res.Status = StatusReorder
	case measured == 0 || window <= 0:
		res.Status = StatusNoData
	default:
		res.Status = StatusOK
		res.Valid = true
		tp := rate(measured, window)
		mb := tp * float64(r.cfg.Size) / 1e6
		res.Throughput, res.MBPerS = &tp, &mb
	}
	mem := r.readRSS()
	res.RSSKB, res.RSSPeakKB = mem.rss, mem.peak
	return res
}

func rate(n int64, d time.Duration) float64 {
	if d <= 0 {
		return 0
	}
	return float64(n) / d.Seconds()
}

// closeAll closes every element of s with closeFn, concurrently.
func closeAll[T any](s []T, closeFn func(T)) {
	var wg sync.WaitGroup
	for _, v := range s {
		wg.Go(func() { closeFn(v) })
	}
	wg.Wait()
}

// firstLost returns the first consumer connection loss, or nil.
func firstLost(cs []*consumer) error {
	for _, c := range cs {
		if err := c.lostErr(); err != nil {
			return err
		}
	}
	return nil
}

// watchCPU reads the broker's CPU time at from and at to, on a goroutine
// of its own; the function it returns waits for the second reading and
// returns the time used in between, false when there is no broker pid,
// no end, or /proc cannot be read.
func (r *runner) watchCPU(ctx context.Context, from, to time.Time) func() (time.Duration, bool) {
	if r.cfg.BrokerPID == 0 || to.IsZero() {
		return func() (time.Duration, bool) { return 0, false }
	}
	type reading struct {
		used time.Duration
		ok   bool
	}
	done := make(chan reading, 1)
	go func() {
		at := func(t time.Time) (time.Duration, bool) {
			select {
			case <-time.After(time.Until(t)):
			case <-ctx.Done():
				return 0, false
			}
			return processCPU(r.cfg.BrokerPID)
		}
		a, okA := at(from)
		b, okB := at(to)
		done <- reading{b - a, okA && okB}
	}()
	return func() (time.Duration, bool) {
		x := <-done
		return x.used, x.ok
	}
}

// clockTick is the unit of the CPU times in /proc/PID/stat: USER_HZ, 100
// on Linux whatever the kernel's own tick.
const clockTick = 10 * time.Millisecond

// processCPU returns the user and system time process pid has used, from
// /proc/PID/stat.
func processCPU(pid int) (time.Duration, bool) {
	data, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, false
	}
	// The command name, in parentheses, may hold spaces: fields are
	// counted after its closing one. utime and stime are fields 14 and
	// 15, the 12th and 13th after it.
	i := bytes.LastIndexByte(data, ')')
	if i < 0 {
		return 0, false
	}
	f := strings.Fields(string(data[i+1:]))
	if len(f) < 13 {
		return 0, false
	}
	u, err1 := strconv.ParseInt(f[11], 10, 64)
	st, err2 := strconv.ParseInt(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		return 0, false
	}
	return time.Duration(u+st) * clockTick, true
}

// memory is a broker's resident set size, in kB.
type memory struct{ rss, peak int64 }

// readRSS reads VmRSS and VmHWM of cfg.BrokerPID from /proc. It returns
// zeros when no pid is configured or the file cannot be read: memory is
// informative, never a reason to fail a run.
func (r *runner) readRSS() memory {
	if r.cfg.BrokerPID == 0 {
		return memory{}
	}
	f, err := os.Open("/proc/" + strconv.Itoa(r.cfg.BrokerPID) + "/status")
	if err != nil {
		return memory{}
	}
	defer f.Close()
	var m memory
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		name, value, ok := strings.Cut(sc.Text(), ":")
		if !ok {
			continue
		}
		kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(value), " kB"), 10, 64)
		if err != nil {
			continue
		}
		switch name {
		case "VmRSS":
			m.rss = kb
		case "VmHWM":
			m.peak = kb
		}
	}
	return m
}

// meter counts the events that make the throughput (PUBACKs in produce,
// first deliveries otherwise) inside the measurement window, and records
// the latencies of messages sent inside it. Safe for concurrent use.
type meter struct {
	countAcks bool
	from, to  atomic.Int64 // Unix nanos: events in [from, to) are measured
	measured  atomic.Int64
	last      atomic.Int64 // Unix nanos of the last measured event
	puback    *Histogram
	e2e       *Histogram
}

func newMeter(countAcks bool) *meter {
	m := &meter{countAcks: countAcks, puback: NewHistogram(), e2e: NewHistogram()}
	m.from.Store(math.MaxInt64) // nothing is measured before setWindow
	return m
}

// setWindow sets the measurement window; a zero to leaves it open.
func (m *meter) setWindow(from, to time.Time) {
	end := int64(math.MaxInt64)
	if !to.IsZero() {
		end = to.UnixNano()
	}
	m.to.Store(end)
	m.from.Store(from.UnixNano())
	m.last.Store(from.UnixNano())
}

// acked records a PUBACK received at now for a message sent at sentAt.
func (m *meter) acked(sentAt, now int64) {
	if sentAt >= m.from.Load() {
		m.puback.Record(time.Duration(now - sentAt))
	}
	if m.countAcks {
		m.count(now)
	}
}

// written records a QoS 0 publish written at now: it has no PUBACK, so no
// latency, but counts as acknowledged in produce.
func (m *meter) written(now int64) {
	if m.countAcks {
		m.count(now)
	}
}

// delivered records a first delivery received at now.
func (m *meter) delivered(sentAt, now int64) {
	if sentAt >= m.from.Load() {
		m.e2e.Record(time.Duration(now - sentAt))
	}
	if !m.countAcks {
		m.count(now)
	}
}

func (m *meter) count(now int64) {
	if now < m.from.Load() || now >= m.to.Load() {
		return
	}
	m.measured.Add(1)
	for {
		l := m.last.Load()
		if now <= l || m.last.CompareAndSwap(l, now) {
			return
		}
	}
}

func (m *meter) lastEvent() time.Time {
	return time.Unix(0, m.last.Load())
}
