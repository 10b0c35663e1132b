package queue

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"
)

// ManagerOptions configure a Manager.
type ManagerOptions struct {
	// Usually set.
	Store      LogStore
	Defaults   Options
	Declared   map[string]Options
	AutoCreate bool
	Logger     *slog.Logger

	// Fine tuning.
	// RingSize is how many of a partition's newest messages stay in memory
	// at most; RingBytes bounds their payload bytes. A partition's ring
	// starts small and grows to that as messages come.
	RingSize  int
	RingBytes int64
	// MaxBatch caps the writes of one commit.
	MaxBatch int
	// CommitLinger is LogOptions.Linger (storage.commit_linger).
	CommitLinger time.Duration
	// MaxPayload refuses larger payloads with ErrTooLarge; 0 means no limit.
	MaxPayload int
	// Tick is how often leases, retries and delays are checked.
	Tick time.Duration
	// RetainEvery is how often settled messages are deleted.
	RetainEvery time.Duration
	// SyncInterval bounds how long the writes of queues with durability
	// async wait for an fsync: one runs this long after the first write
	// made without one.
	SyncInterval time.Duration
	// Admit, if set, is asked before each Manager.Publish to the named
	// queue; its error refuses the publish before anything is stored (e.g.
	// ErrStorageFull while the disk is short of space). It is called on
	// every publish: it must be quick. Dead-lettering, settlements and
	// deletes do not ask it.
	Admit func(queue string) error
	// Forward, if set, publishes a message whose partition another node
	// serves (a dead letter replayed into a partition led elsewhere); done
	// runs once that node stored it, with msg.Offset set, or failed. Without
	// it such a message is refused with ErrNotOwned.
	Forward func(ctx context.Context, queue string, msg *Message, done func(error))
	// CutPassed, if set, is asked in a cluster whether group has settled
	// partition of queue, served by another node, up to its cut of the
	// growth to count to (Manager.CutPassed there), by an answer taken
	// after since. It is asked while a partition's lock is held: it must
	// answer at once, from what it knows, and find out meanwhile; the
	// partition asks again at each tick until it is true.
	CutPassed func(queue, group string, to, partition int, since time.Time) bool
	// OnCommit, if set, is told about every committed batch.
	OnCommit func(CommitStats)
	// OnAck, if set, is told about every acked message: its queue and when
	// it was enqueued. It runs with the queue's lock held: it must be quick.
	OnAck func(queue string, enqueuedAt time.Time)
	// HandoverGrace is how long a partition loaded from storage waits
	// before it delivers again the messages its last owner may have had
	// out (unsettled below the delivered mark): in a cluster, a delivery
	// on its way to a client on another node reaches it, or turns stale
	// there and is not sent (LeaseRef.Until), before the message goes out
	// again, so that every delivery after the first carries DUP. 0 on a
	// single node, where no delivery outlives its process.
	HandoverGrace time.Duration
	// StaleAfter, when set, is how long after its lease a delivery may
	// still be written to its client; later it is given back unsent
	// (LeaseRef.Live). A cluster sets it below HandoverGrace: a node that
	// was paused (SIGSTOP, a stalled VM) after it leased a message, and
	// whose partition another node took over meanwhile, must not write
	// the message without DUP once the new owner delivered it again. 0 on
	// a single node.
	StaleAfter time.Duration
	// Clock replaces time.Now in tests.
	Clock func() time.Time

	// ManualOwnership: partitions are served only once acquired by the
	// caller (a cluster decides which node serves which); without it
	// every partition is acquired with SingleNodeEpoch as its queue is
	// recovered or created.
	ManualOwnership bool
	// OnQueue, if set, is told about each queue created after the start,
	// once it can be found by name. It must not block.
	OnQueue func(q *Queue)
}

// DefaultManagerOptions returns the fine-tuning defaults.
func DefaultManagerOptions() ManagerOptions {
	return ManagerOptions{
		Defaults:     DefaultOptions(),
		AutoCreate:   true,
		RingSize:     1024,
		RingBytes:    4 << 20,
		MaxBatch:     4096,
		MaxPayload:   1 << 20,
		Tick:         20 * time.Millisecond,
		RetainEvery:  500 * time.Millisecond,
		SyncInterval: 100 * time.Millisecond,
	}
}

// Manager holds the queues of a node.
type Manager struct {
	opts ManagerOptions
	log  *slog.Logger
	logs Logs

	mu       sync.RWMutex
	queues   map[string]*Queue        // by name, dead-letter queues included
	creating map[string]chan struct{} // queues being created, closed when done
	closed   bool

	wg   sync.WaitGroup
	stop chan struct{}

	tickMu  sync.Mutex
	ticking []*partition // partitions with timer work pending (see partition.ticking)
	// tickWake tells the timer that the first partition with timer work
	// came: it ticks every Tick again, not only at the next retention.
	tickWake chan struct{}
	// unsynced tells the timer that the logs hold writes made without a
	// sync (LogOptions.Unsynced).
	unsynced chan struct{}

	admin sync.Mutex // serializes the operations of admin.go
}

// NewManager recovers the queues found in the store and starts the
// logs and the timer. It fails when a stored queue's partition count
// differs from its declared one.
func NewManager(o ManagerOptions) (*Manager, error) {
	d := DefaultManagerOptions()
	if o.RingSize <= 0 {
		o.RingSize = d.RingSize
	}
	if o.RingBytes <= 0 {
		o.RingBytes = d.RingBytes
	}
	if o.MaxBatch <= 0 {
		o.MaxBatch = d.MaxBatch
	}
	if o.Tick <= 0 {
		o.Tick = d.Tick
	}
	if o.RetainEvery <= 0 {
		o.RetainEvery = d.RetainEvery
	}
	if o.SyncInterval <= 0 {
		o.SyncInterval = d.SyncInterval
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	if o.Defaults == (Options{}) {
		o.Defaults = d.Defaults
	}
	if err := o.Defaults.Validate(); err != nil {
		return nil, err
	}
	m := &Manager{opts: o, log: o.Logger, queues: map[string]*Queue{}, creating: map[string]chan struct{}{}, stop: make(chan struct{}),
		tickWake: make(chan struct{}, 1), unsynced: make(chan struct{}, 1)}
	logs, err := o.Store.OpenLogs(LogOptions{MaxBatch: o.MaxBatch, Linger: o.CommitLinger, LingerBatch: lingerBatch, OnCommit: o.OnCommit, Unsynced: m.wakeSync})
	if err != nil {
		return nil, err
	}
	m.logs = logs
	if err := m.recover(); err != nil {
		_ = m.logs.Close()
		return nil, err
	}
	go m.run()
	return m, nil
}

func (m *Manager) now() time.Time {
	if m.opts.Clock != nil {
		return m.opts.Clock()
	}
	return time.Now()
}

// lingerBatch is how many pending writes end a commit's linger
// (CommitLinger): measured, 32 keeps a saturated node as fast as with
// no linger, and takes a third off the CPU per message at 10k msgs/s.
const lingerBatch = 32

func (m *Manager) recover() error {
	metas, err := m.logs.Queues()
	if err != nil {
		return fmt.Errorf("queue: reading queue metadata: %w", err)
	}
	type growing struct {
		q *Queue
		o Options
	}
	var grows []growing
	for _, meta := range metas {
		if IsDLQ(meta.Name) {
			continue
		}
		opts := m.optionsFor(meta.Name)
		if meta.Declared != nil {
			opts = *meta.Declared
		}
		if _, declared := m.opts.Declared[meta.Name]; declared && opts.Partitions != meta.Partitions {
			if opts.Partitions < meta.Partitions || meta.Declared != nil || m.opts.ManualOwnership {
				return fmt.Errorf("%w: queue %q has %d partitions on disk, the config says %d: a queue's partitions can grow, not shrink (and in a cluster only through PUT /api/v1/queues/%s)",
					ErrPartitionsChanged, meta.Name, meta.Partitions, opts.Partitions, meta.Name)
			}
			grows = append(grows, growing{o: opts}) // the config grew it: grown once it is served
		}
		opts.Partitions = meta.Partitions
		q := m.build(meta.Name, opts)
		q.owner, q.growths = meta.Owner, meta.Growths
		if err := m.acquireAll(q); err != nil {
			return err
		}
		m.queues[q.name], m.queues[q.dlq.name] = q, q.dlq
		if n := len(grows); n > 0 && grows[n-1].q == nil {
			grows[n-1].q = q
		}
	}
	m.log.Info("queues recovered", "queues", len(metas)/2)
	for _, g := range grows {
		m.admin.Lock()
		err := m.grow(context.Background(), g.q, g.o, false)
		m.admin.Unlock()
		if err != nil {
			return err
		}
	}
	return nil
}

func (m *Manager) optionsFor(name string) Options {
	if o, ok := m.opts.Declared[name]; ok {
		return o
	}
	return m.opts.Defaults
}

// build creates the in-memory queue and its dead-letter queue, their
// partitions not yet acquired.
func (m *Manager) build(name string, opts Options) *Queue {
	q := m.buildOne(name, opts)
	// The dead-letter queue keeps its parent's limits but drops its own
	// oldest when full rather than refusing a dead letter.
	q.dlq = m.buildOne(DLQName(name), dlqOptions(opts))
	return q
}

// buildOne creates the in-memory queue with its partitions not yet
// acquired (see Acquire).
func (m *Manager) buildOne(name string, opts Options) *Queue {
	q := &Queue{m: m, name: name, opts: opts, groups: map[string]*group{}}
	q.retention.Store(limitsOf(opts))
	q.parts.Store(new([]*partition))
	q.addPartitions(opts.Partitions)
	return q
}

// addPartitions adds partitions to the queue's up to n, not yet acquired.
// The new slice is published at once: every lock of the queue must be
// held, unless no one else can see the queue yet.
func (q *Queue) addPartitions(n int) []*partition {
	m := q.m
	parts := slices.Clone(q.partitions())
	var added []*partition
	for i := len(parts); i < n; i++ {
		p := newPartition(q, i, ringOptions{slots: m.opts.RingSize, bytes: m.opts.RingBytes})
		p.log = m.logs.Log(PartitionID{q.name, i}, p.appended)
		parts = append(parts, p)
		added = append(added, p)
	}
	q.parts.Store(&parts)
	return added
}

// Queue returns the named queue (a dead-letter queue by DLQName) if it exists.
func (m *Manager) Queue(name string) *Queue {
	m.mu.RLock()
	defer m.mu.RUnlock()
	return m.queues[name]
}

// Queues returns every queue, dead-letter queues included.
func (m *Manager) Queues() []*Queue {
	m.mu.RLock()
	defer m.mu.RUnlock()
	qs := make([]*Queue, 0, len(m.queues))
	for _, q := range m.queues {
		qs = append(qs, q)
	}
	return qs
}

// Open returns the named queue, creating it when it is declared or
// auto_create is on. A dead-letter queue name opens its parent.
func (m *Manager) Open(ctx context.Context, name string) (*Queue, error) {
	if q := m.Queue(name); q != nil {
		return q, nil
	}
	parent := name
	if IsDLQ(name) {
		parent = name[:len(name)-len(dlqSuffix)]
	}
	if err := CheckQueueName(parent); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrInvalidTopic, err)
	}
	_, declared := m.opts.Declared[parent]
	if !declared && !m.opts.AutoCreate {
		return nil, ErrNoSuchQueue
	}
	opts := m.optionsFor(parent)
	q, _, err := m.create(ctx, parent, func(ctx context.Context) error {
		return m.persistMeta(ctx, parent, opts.Partitions)
	}, opts)
	if err != nil {
		return nil, err
	}
	if IsDLQ(name) {
		return q.dlq, nil
	}
	return q, nil
}

// create makes the queue name with the settings opts, once: persist
// records it durably, then its partitions are acquired and it is
// published to the manager. No lock of the manager is held meanwhile, so
// other queues are served while this one's fsync runs; another create of
// the same name waits for this one and returns its queue. created reports
// whether this call made it.
func (m *Manager) create(ctx context.Context, name string, persist func(context.Context) error, opts Options) (q *Queue, created bool, err error) {
	for {
		m.mu.Lock()
		if m.closed {
			m.mu.Unlock()
			return nil, false, ErrClosed
		}
		if q := m.queues[name]; q != nil {
			m.mu.Unlock()
			return q, false, nil
		}
		wait := m.creating[name]
		if wait == nil {
			break
		}
		m.mu.Unlock()
		select {
		case <-wait:
		case <-ctx.Done():
			return nil, false, ctx.Err()
		}
	}
	done := make(chan struct{})
	m.creating[name] = done
	m.mu.Unlock()
	defer func() {
		m.mu.Lock()
		delete(m.creating, name)
		if err == nil {
			m.queues[q.name], m.queues[q.dlq.name] = q, q.dlq
		}
		m.mu.Unlock()
		close(done)
		if err == nil && m.opts.OnQueue != nil {
			m.opts.OnQueue(q)
		}
	}()
	if err := persist(ctx); err != nil {
		return nil, false, err
	}
	q = m.build(name, opts)
	q.owner = OwnerFrom(ctx)
	if err := m.acquireAll(q); err != nil {
		return nil, false, err
	}
	m.log.Info("queue created", "queue", name, "partitions", opts.Partitions)
	return q, true, nil
}

// persistMeta durably records a queue and its dead-letter queue before
// anything is appended to them.
func (m *Manager) persistMeta(ctx context.Context, name string, partitions int) error {
	return m.logs.SaveQueues(ctx, []QueueMeta{{Name: name, Partitions: partitions, Owner: OwnerFrom(ctx)}, {Name: DLQName(name), Partitions: partitions}})
}

// Publish appends msg to the named queue (see Queue.Publish).
func (m *Manager) Publish(ctx context.Context, name string, msg *Message, done func(error)) {
	if m.opts.Admit != nil {
		if err := m.opts.Admit(name); err != nil {
			finish(done, err)
			return
		}
	}
	// Refused before the queue is opened: a refused first publish creates
	// no queue.
	if m.opts.MaxPayload > 0 && len(msg.Payload) > m.opts.MaxPayload {
		finish(done, TooLarge(len(msg.Payload), m.opts.MaxPayload))
		return
	}
	q, err := m.Open(ctx, name)
	if err != nil {
		finish(done, err)
		return
	}
	q.Publish(msg, done)
}

// Subscribe adds a consumer to the filter's queue and group.
func (m *Manager) Subscribe(ctx context.Context, f Filter, r Receiver, o ConsumerOptions) (Subscription, error) {
	// Refused before the queue is opened: a refused first subscribe
	// creates no queue.
	if err := m.CheckSubscription(ctx, f, o); err != nil {
		return nil, err
	}
	q, err := m.Open(ctx, f.Queue)
	if err != nil {
		return nil, err
	}
	o.Subjects = f.Subjects
	c, err := q.Subscribe(f.Group, r, o)
	if err != nil {
		return nil, err // not a nil *Consumer in a non-nil interface
	}
	return c, nil
}

func (m *Manager) run() {
	// The timer ticks every Tick while some partition has timer work,
	// and otherwise sleeps until the next retention: an idle node wakes
	// a few times a second, not fifty.
	t := time.NewTimer(m.opts.Tick)
	defer t.Stop()
	// The sync timer runs SyncInterval after the logs first hold a write
	// made without a sync, not on a fixed beat.
	st := time.NewTimer(m.opts.SyncInterval)
	st.Stop()
	defer st.Stop()
	syncing := false
	lastRetain := m.now()
	resting := false
	for {
		select {
		case <-m.stop:
			return
		case <-m.unsynced:
			if !syncing {
				syncing = true
				st.Reset(m.opts.SyncInterval)
			}
			continue
		case <-st.C:
			syncing = false
			m.logs.SyncAsync()
			continue
		case <-m.tickWake:
			if resting {
				resting = false
				t.Reset(m.opts.Tick)
			}
			continue
		case <-t.C:
		}
		now := m.now()
		retain := now.Sub(lastRetain) >= m.opts.RetainEvery
		if retain {
			lastRetain = now
		}
		if m.tick(now, retain) {
			// Ticking again: a partition coming now need not reset the
			// timer, which would put the next tick off.
			resting = false
			t.Reset(m.opts.Tick)
		} else {
			resting = true
			t.Reset(max(m.opts.Tick, m.opts.RetainEvery-m.now().Sub(lastRetain)))
		}
	}
}

// tick runs the timer's work on the partitions that have some pending
// and, when retain is set, the queues' retention work. It reports whether
// partitions have timer work still.
func (m *Manager) tick(now time.Time, retain bool) bool {
	m.tickMu.Lock()
	ps := m.ticking
	m.ticking = nil
	m.tickMu.Unlock()
	var busy []*partition
	every := m.opts.RetainEvery
	for _, p := range ps {
		if p.retained.IsZero() {
			p.retained = now.Add(-every * time.Duration(p.index%32) / 32)
		}
		due := now.Sub(p.retained) >= every
		if due {
			p.retained = now
		}
		if p.tick(now, due) {
			busy = append(busy, p)
		}
	}
	m.tickMu.Lock()
	m.ticking = append(m.ticking, busy...)
	m.tickMu.Unlock()
	if retain {
		for _, q := range m.Queues() {
			q.retainTick(now)
		}
	}
	m.tickMu.Lock()
	defer m.tickMu.Unlock()
	return len(m.ticking) > 0
}

// wakeSync tells the timer that the logs hold writes to sync
// (LogOptions.Unsynced).
func (m *Manager) wakeSync() {
	select {
	case m.unsynced <- struct{}{}:
	default:
	}
}

// addTicking puts p in the list of partitions with timer work.
func (m *Manager) addTicking(p *partition) {
	m.tickMu.Lock()
	m.ticking = append(m.ticking, p)
	m.tickMu.Unlock()
	select {
	case m.tickWake <- struct{}{}:
	default:
	}
}

// Close stops the timer, finishes every pending commit and returns. The
// store stays open; its owner closes it.
func (m *Manager) Close(ctx context.Context) error {
	m.mu.Lock()
	if m.closed {
		m.mu.Unlock()
		return nil
	}
	m.closed = true
	m.mu.Unlock()
	close(m.stop)
	done := make(chan struct{})
	go func() {
		for _, q := range m.Queues() {
			q.lockAll()
			q.closeLocked()
			q.unlockAll()
		}
		m.closeCommitters()
		m.wg.Wait()
		close(done)
	}()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (m *Manager) closeCommitters() {
	_ = m.logs.Close()
}
