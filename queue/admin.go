package queue

import (
	"container/heap"
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"sync"
)

// The operations an operator runs on queues: Purge, DeleteGroup, ReplayDLQ
// and Manager.Declare (snapshot.go has the read-only views). They change
// state only after every argument has been checked, and they are
// serialized per manager (Manager.admin) so that two replays cannot take
// the same dead letter.

// Errors of the admin operations.
var (
	// ErrNoSuchGroup: the queue has no consumer group of that name.
	ErrNoSuchGroup = errors.New("queue: no such consumer group")
	// ErrGroupActive: the group still has consumers connected.
	ErrGroupActive = errors.New("queue: consumer group has consumers connected")
	// ErrBadMessageID: a msg-id is not of the form {partition}-{offset}.
	ErrBadMessageID = errors.New("queue: malformed msg-id")
	// ErrInvalidName: not a valid queue name (1 to 128 characters of A-Z a-z 0-9 _ . -).
	ErrInvalidName = errors.New("queue: invalid queue name")
	// ErrInvalidGroup: not a valid group name (ValidGroupName).
	ErrInvalidGroup = errors.New("queue: invalid group name")
	// ErrNotParent: the operation needs a queue with a dead-letter queue,
	// not a dead-letter queue.
	ErrNotParent = errors.New("queue: a dead-letter queue has no dead-letter queue")
)

// Purged is what Purge did: how many messages it deleted, and from which
// partitions.
type Purged struct {
	Messages   uint64
	Partitions []int // the partitions purged: those this node serves
}

// Purge deletes every message the queue holds when it runs, for every
// group: each group's floor moves past them, the messages its consumers
// hold are taken back (their late PUBACKs change nothing) and the range is
// deleted from storage, all persisted before Purge returns. Publishes still
// being committed when it runs are kept. It acts on the partitions this
// node serves (every one on a single node; in a cluster each node purges
// its own, through their replicated logs) and says which.
func (q *Queue) Purge(ctx context.Context) (Purged, error) {
	q.m.admin.Lock()
	defer q.m.admin.Unlock()
	var k kicks
	q.lockAll()
	if q.closed {
		q.unlockAll()
		return Purged{}, ErrClosed
	}
	b := new(Batch)
	res := Purged{Partitions: []int{}}
	for _, p := range q.partitions() {
		if p.servingLocked() != nil {
			continue
		}
		res.Partitions = append(res.Partitions, p.index)
		to := p.committed
		if to > p.first {
			res.Messages += to - p.first
			b.Deletes = append(b.Deletes, RangeDelete{Queue: q.name, Partition: p.index, From: p.first, To: to})
			p.advance(to)
		}
		p.ring.trim(to)
	}
	for _, g := range q.groups {
		for _, cur := range g.cursors {
			if cur.p.servingLocked() != nil {
				continue
			}
			cur.retries = nil
			cur.purgeLocked(b, &k)
		}
	}
	wait := q.commitLocked(b)
	q.dispatchAllLocked(q.m.now())
	q.unlockAll()
	k.run()
	if err := wait(ctx); err != nil {
		return Purged{}, err
	}
	q.m.log.Info("queue purged", "queue", q.name, "messages", res.Messages, "partitions", len(res.Partitions))
	return res, nil
}

// purgeLocked moves the cursor past every message of its partition below
// the committed offset (the partition's first offset, after a purge).
func (c *cursor) purgeLocked(b *Batch, k *kicks) {
	to := c.p.first
	q, g, p := c.g.q.name, c.g.name, c.p.index
	for _, l := range c.p.leasesWhere(func(l *Lease) bool { return l.cur == c }) {
		c.p.revokeLocked(l, k)
	}
	// Marks on disk below the new floor go; marks not yet written are
	// forgotten. Settlements above it (a replay's) stay.
	for _, off := range c.unmarks {
		b.Marks = append(b.Marks, SettleMark{Queue: q, Group: g, Partition: p, Offset: off})
	}
	c.unmarks = c.unmarks[:0]
	for off, onDisk := range c.settled {
		if off >= to {
			continue
		}
		if onDisk {
			b.Marks = append(b.Marks, SettleMark{Queue: q, Group: g, Partition: p, Offset: off})
		}
		delete(c.settled, off)
	}
	c.marks = slices.DeleteFunc(c.marks, func(off uint64) bool { return off < to })
	for off := range c.counts {
		if off < to {
			b.Deliveries = append(b.Deliveries, DeliveryMark{Queue: q, Group: g, Partition: p, Offset: off})
			delete(c.counts, off)
		}
	}
	if c.floor < to {
		c.floor = to
		for {
			onDisk, ok := c.settled[c.floor]
			if !ok {
				break
			}
			if onDisk {
				b.Marks = append(b.Marks, SettleMark{Queue: q, Group: g, Partition: p, Offset: c.floor})
			}
			delete(c.settled, c.floor)
			c.floor++
		}
	}
	if c.floor != c.savedFloor {
		b.Floors = append(b.Floors, FloorWrite{Queue: q, Group: g, Partition: p, Floor: c.floor, Filter: c.g.filter})
		c.savedFloor = c.floor
	}
	c.next = max(c.next, to)
	c.floorSeen.Store(c.floor)
	c.ready, c.pinned = nil, nil
	c.aside, c.asideN, c.asideBytes = nil, 0, 0
	clear(c.keys)
	c.gen++
	c.parked, c.parkedBytes = 0, 0
	c.ra, c.raPos, c.raFrom, c.raTo = nil, 0, 0, 0
}

// DeleteGroup removes a consumer group and its state, persisted before it
// returns, and returns the partitions it removed it from: those this node
// serves (every one on a single node; in a cluster each node removes the
// group from its own, through their replicated logs). A group with
// consumers connected is refused (ErrGroupActive): they would recreate it
// at once. A consumer that subscribes to the group later starts it again
// from the oldest retained message.
func (q *Queue) DeleteGroup(ctx context.Context, name string) ([]int, error) {
	q.m.admin.Lock()
	defer q.m.admin.Unlock()
	q.lockAll()
	if err := q.checkDeleteGroupLocked(name); err != nil {
		q.unlockAll()
		return nil, err
	}
	g := q.groups[name]
	delete(q.groups, name)
	b := new(Batch)
	parts := []int{}
	for _, cur := range g.cursors {
		if cur.p.servingLocked() != nil {
			continue
		}
		parts = append(parts, cur.p.index)
		b.DropGroups = append(b.DropGroups, GroupRef{Queue: q.name, Group: name, Partition: cur.p.index})
	}
	wait := q.commitLocked(b)
	q.unlockAll()
	if err := wait(ctx); err != nil {
		return nil, err
	}
	q.m.log.Info("consumer group deleted", "queue", q.name, "group", name, "partitions", len(parts))
	return parts, nil
}

// CheckDeleteGroup reports why DeleteGroup would refuse to delete the
// group now (ErrNoSuchGroup, ErrGroupActive), or nil: a cluster asks
// every node before any deletes it.
func (q *Queue) CheckDeleteGroup(name string) error {
	q.lockAll()
	defer q.unlockAll()
	return q.checkDeleteGroupLocked(name)
}

func (q *Queue) checkDeleteGroupLocked(name string) error {
	if q.closed {
		return ErrClosed
	}
	g := q.groups[name]
	if g == nil {
		return fmt.Errorf("%w: %q in queue %s", ErrNoSuchGroup, name, q.name)
	}
	if n := len(g.consumers); n > 0 {
		return fmt.Errorf("%w: group %s of queue %s has %d", ErrGroupActive, name, q.name, n)
	}
	return nil
}

// Replayed names a dead letter that was published again: its msg-id in the
// dead-letter queue and the msg-id of the new message in the queue ("" when
// another node stored it and its offset is not known here).
type Replayed struct {
	DLQID string
	ID    string
}

// Replay is what ReplayDLQ did: the dead letters it replayed, in order,
// and the dead-letter queue's partitions it replayed from (those this
// node serves).
type Replay struct {
	Letters    []Replayed
	Partitions []int
}

// replayChunk is how many dead letters ReplayDLQ reads and publishes at a time.
const replayChunk = 256

// ReplayDLQ publishes dead letters of q's dead-letter queue into q again,
// the ones named by their dead-letter msg-ids (as a dead-letter consumer
// sees them in msg-id, or Peek lists them), or, with no ids, every dead
// letter the dead-letter queue holds when it starts that some
// dead-letter group has not settled. It acts on the dead-letter
// partitions this node serves (every one on a single node; in a cluster,
// each node replays from its own and names that are in other partitions
// are left to their nodes). It returns what it replayed; on an error, what
// it replayed before it.
//
// The choices it makes:
//   - A replayed message is a new message of q (new msg-id, delivery-count
//     1, enqueued now, no expiry) with the dead letter's key, subject,
//     properties and payload. Messages of one key are replayed in their
//     dead-letter order. One whose partition another node serves goes
//     there (ManagerOptions.Forward).
//   - It goes to the group that dead-lettered it, not to every group: the
//     other groups of q already settled the original. The other groups
//     have it settled at once (persisted with their next settlements, so a
//     crash in between may deliver it to them: at least once). Dead letters
//     without a group (dropped for the whole queue), or whose group has
//     since been deleted, go to every group.
//   - Once its copy is stored, the dead letter is settled for every group
//     of the dead-letter queue (leases on it are taken back) and that
//     settlement is persisted before ReplayDLQ returns, so it is not
//     replayed or delivered again; retention then deletes it. A
//     dead-letter queue that has no group gets the group default, which
//     plain $queue/{q}/$dlq subscribers join, to record it. A group
//     subscribing to the dead-letter queue for the first time later starts
//     at its oldest retained message, which can include replayed messages
//     that are still retained behind one that was not replayed.
//   - Named ids are checked first (CheckReplay): a malformed one
//     (ErrBadMessageID) or one the dead-letter queue does not hold
//     unsettled (ErrUnknownMessage) fails the call before anything
//     changes. A publish that fails (a full queue, storage) stops the
//     replay: the dead letters whose copies were not stored stay in the
//     dead-letter queue.
func (q *Queue) ReplayDLQ(ctx context.Context, ids []string) (Replay, error) {
	dlq := q.dlq
	if dlq == nil {
		return Replay{}, ErrNotParent
	}
	q.m.admin.Lock()
	defer q.m.admin.Unlock()
	res := Replay{Partitions: dlq.served()}
	var err error
	if len(ids) > 0 {
		var dls []deadLetter
		if dls, err = dlq.pendingByID(ids, res.Partitions); err != nil {
			return Replay{}, err
		}
		for len(dls) > 0 && err == nil {
			n := min(len(dls), replayChunk)
			var r []Replayed
			r, err = q.replay(ctx, dls[:n])
			res.Letters = append(res.Letters, r...)
			dls = dls[n:]
		}
	} else {
		res.Letters, err = q.replayAll(ctx, res.Partitions)
	}
	if err != nil {
		q.m.log.Error("replaying dead letters failed", "queue", q.name, "replayed", len(res.Letters), "err", err)
	} else if len(res.Letters) > 0 {
		q.m.log.Info("dead letters replayed", "queue", q.name, "messages", len(res.Letters))
	}
	return res, err
}

// CheckReplay checks dead-letter msg-ids as ReplayDLQ does, without
// replaying them, and returns the dead-letter partitions this node serves:
// the ids in the others are not checked (a cluster asks every node before
// any replays).
func (q *Queue) CheckReplay(ids []string) ([]int, error) {
	dlq := q.dlq
	if dlq == nil {
		return nil, ErrNotParent
	}
	served := dlq.served()
	_, err := dlq.pendingByID(ids, served)
	return served, err
}

// served returns the partitions this node serves.
func (q *Queue) served() []int {
	q.lockAll()
	defer q.unlockAll()
	out := []int{}
	for _, p := range q.partitions() {
		if p.servingLocked() == nil {
			out = append(out, p.index)
		}
	}
	return out
}

// replayAll replays every dead letter some dead-letter group has not
// settled in the partitions named, up to the offsets committed when it
// starts.
func (q *Queue) replayAll(ctx context.Context, parts []int) ([]Replayed, error) {
	dlq := q.dlq
	var done []Replayed
	for _, pi := range parts {
		p := dlq.partitions()[pi]
		p.mu.Lock()
		from, to := p.first, p.committed
		p.mu.Unlock()
		for from < to {
			if err := ctx.Err(); err != nil {
				return done, err
			}
			msgs, err := dlq.read(pi, from, to, replayChunk)
			if err != nil {
				return done, err
			}
			if len(msgs) == 0 {
				break
			}
			from = msgs[len(msgs)-1].Offset + 1
			p.mu.Lock()
			msgs = slices.DeleteFunc(msgs, func(m *Message) bool { return !dlq.pendingLocked(pi, m.Offset) })
			p.mu.Unlock()
			items := make([]deadLetter, len(msgs))
			for i, m := range msgs {
				items[i] = deadLetter{pi, m}
			}
			r, err := q.replay(ctx, items)
			done = append(done, r...)
			if err != nil {
				return done, err
			}
		}
	}
	return done, nil
}

// deadLetter is a message of a dead-letter queue and its partition.
type deadLetter struct {
	partition int
	m         *Message
}

// pendingLocked reports whether the dead-letter queue holds the message at
// off of partition pi unsettled by at least one group (any message it
// holds, when it has no group). Partition pi's lock must be held.
func (q *Queue) pendingLocked(pi int, off uint64) bool {
	p := q.partitions()[pi]
	if off < p.first || off >= p.committed {
		return false
	}
	if len(q.groups) == 0 {
		return true
	}
	for _, g := range q.groups {
		if !g.cursors[pi].isSettled(off) {
			return true
		}
	}
	return false
}

// pendingByID checks the msg-ids against the dead-letter queue q and reads
// the messages of those in the partitions served (the others are left
// out), in the order given, duplicates dropped.
func (q *Queue) pendingByID(ids []string, served []int) ([]deadLetter, error) {
	type ref struct {
		p   int
		off uint64
		id  string
	}
	var refs []ref
	seen := map[ref]bool{}
	for _, id := range ids {
		p, off, err := ParseMessageID(id)
		if err != nil {
			return nil, fmt.Errorf("%w: %q (want {partition}-{offset})", ErrBadMessageID, id)
		}
		if p >= len(q.partitions()) {
			return nil, fmt.Errorf("%w: %s is not in %s: it has %d partitions", ErrUnknownMessage, id, q.name, len(q.partitions()))
		}
		r := ref{p, off, ""}
		if seen[r] || !slices.Contains(served, p) {
			continue
		}
		seen[r] = true
		r.id = id
		refs = append(refs, r)
	}
	out := make([]deadLetter, len(refs))
	q.lockAll()
	for i, r := range refs {
		if !q.pendingLocked(r.p, r.off) {
			q.unlockAll()
			return nil, fmt.Errorf("%w: %s is not in %s", ErrUnknownMessage, r.id, q.name)
		}
		if m, _ := q.partitions()[r.p].cached(r.off); m != nil {
			out[i] = deadLetter{r.p, m}
		}
	}
	q.unlockAll()
	for i, r := range refs {
		if out[i].m != nil {
			continue
		}
		msgs, err := q.read(r.p, r.off, r.off+1, 1)
		if err != nil {
			return nil, err
		}
		if len(msgs) == 0 {
			return nil, fmt.Errorf("%w: %s is not in %s", ErrUnknownMessage, r.id, q.name)
		}
		out[i] = deadLetter{r.p, msgs[0]}
	}
	return out, nil
}

// unknownOffset marks a forwarded copy whose offset its node did not say.
const unknownOffset = math.MaxUint64

// replay publishes the dead letters into q, waits until they are stored,
// then settles those stored in the dead-letter queue.
func (q *Queue) replay(ctx context.Context, dls []deadLetter) ([]Replayed, error) {
	if len(dls) == 0 {
		return nil, nil
	}
	var wg sync.WaitGroup
	errs := make([]error, len(dls))
	news := make([]*Message, len(dls))
	var away []int // forwarded: their partitions are served elsewhere
	q.lockAll()
	var stop error
	for i, dl := range dls {
		msg, target := replayMessage(dl.m)
		if p := q.partitions()[PartitionFor(msg.Key, len(q.partitions()))]; p.servingLocked() != nil {
			if q.m.opts.Forward == nil || q.closed {
				stop = p.servingLocked()
				break
			}
			msg.ReplayFor, msg.Offset = target, unknownOffset
			news[i] = msg
			away = append(away, i)
			continue
		}
		wg.Add(1)
		if stop = q.appendReplayLocked(msg, target, func(err error) { errs[i] = err; wg.Done() }); stop != nil {
			wg.Done()
			break
		}
		news[i] = msg
	}
	q.unlockAll()
	q.forward(ctx, news, away, errs)
	wg.Wait() // every append completes: a log never drops a write

	dlq := q.dlq
	var done []Replayed
	var err error
	var k kicks
	dlq.lockAll()
	if len(dlq.groups) == 0 {
		dlq.groupLocked(DefaultGroup, StartEarliest, nil, "")
	}
	b := new(Batch)
	for i, dl := range dls {
		if news[i] == nil || errs[i] != nil {
			if err == nil {
				err = errors.Join(stop, errs[i])
			}
			continue
		}
		for _, g := range dlq.groups {
			g.cursors[dl.partition].settleAdminLocked(dl.m, b, &k)
		}
		id := ""
		if news[i].Offset != unknownOffset {
			id = MessageID(PartitionFor(news[i].Key, len(q.partitions())), news[i].Offset)
		}
		done = append(done, Replayed{DLQID: MessageID(dl.partition, dl.m.Offset), ID: id})
	}
	for _, g := range dlq.groups {
		for _, cur := range g.cursors {
			cur.flushStateLocked(b)
		}
	}
	wait := dlq.commitLocked(b)
	dlq.dispatchAllLocked(dlq.m.now())
	dlq.unlockAll()
	k.run()
	if werr := wait(ctx); werr != nil && err == nil {
		err = werr
	}
	return done, err
}

// forward publishes the messages news[i] for i in away through
// ManagerOptions.Forward, those of one key one after the other in order,
// and waits for them; errs[i] gets each one's outcome.
func (q *Queue) forward(ctx context.Context, news []*Message, away []int, errs []error) {
	for len(away) > 0 {
		// A wave: the first message left of each key.
		var wave, rest []int
		keys := map[string]bool{}
		for _, i := range away {
			if k := news[i].Key; !keys[k] {
				keys[k] = true
				wave = append(wave, i)
			} else {
				rest = append(rest, i)
			}
		}
		var wg sync.WaitGroup
		for _, i := range wave {
			wg.Add(1)
			q.m.opts.Forward(ctx, q.name, news[i], func(err error) { errs[i] = err; wg.Done() })
		}
		wg.Wait()
		// A key whose message failed sends none after it.
		failed := map[string]bool{}
		for _, i := range wave {
			if errs[i] != nil {
				failed[news[i].Key] = true
			}
		}
		away = away[:0]
		for _, i := range rest {
			if failed[news[i].Key] {
				errs[i] = fmt.Errorf("not replayed: a dead letter of key %q before it failed", news[i].Key)
				continue
			}
			away = append(away, i)
		}
	}
}

// replayMessage returns the message that replays the dead letter dm, and
// the group it is for ("" for every group).
func replayMessage(dm *Message) (*Message, string) {
	m := &Message{Key: dm.Key, Headers: dm.Headers, Payload: dm.Payload}
	m.Headers.User = slices.Clone(dm.Headers.User)
	dl := dm.DeadLetter
	if dl == nil {
		return m, ""
	}
	if t, err := ParseTopic(dl.OriginalTopic); err == nil {
		m.Subject = t.Subject
	}
	return m, dl.Group
}

// appendReplayLocked appends msg like Publish, for the group target only:
// when q has that group, every other group has the new offset settled
// before the message can be delivered. done runs once it is stored or
// failed; an error returned means done will not run.
func (q *Queue) appendReplayLocked(msg *Message, target string, done func(error)) error {
	p := q.partitions()[PartitionFor(msg.Key, len(q.partitions()))]
	if err := p.servingLocked(); err != nil {
		return err
	}
	if err := p.movedLocked(msg.Key); err != nil {
		return err
	}
	size := msg.Size()
	if q.fullLocked(size) {
		return ErrQueueFull
	}
	now := q.m.now()
	msg.EnqueuedAt = now
	q.appendLocked(p, msg, size, now)
	if _, ok := q.groups[target]; ok {
		for name, g := range q.groups {
			if name != target {
				g.cursors[p.index].settleLocked(msg.Offset, nil)
			}
		}
	}
	p.log.Append(p.epoch, msg, nil, q.opts.Durability == DurabilityFsync, done)
	return nil
}

// settleAdminLocked settles m for the cursor's group on an operator's
// behalf: a lease on it is taken back (its consumer's late settlement
// changes nothing), and with ordering key its key passes on as when it is
// acked. A copy of m parked behind its key is dropped from the queue of
// that key; one waiting in the ready or retry heap passes its key on when
// it is popped.
func (c *cursor) settleAdminLocked(m *Message, b *Batch, k *kicks) {
	off := m.Offset
	if c.isSettled(off) {
		return
	}
	revoked := false
	for _, l := range c.p.leasesWhere(func(l *Lease) bool { return l.cur == c }) {
		if l.m.Offset == off {
			c.p.revokeLocked(l, k)
			revoked = true
		}
	}
	if ks := c.keys[m.Key]; ks != nil && off < c.next {
		if i := slices.IndexFunc(ks.waiting, func(w *pending) bool { return w.m.Offset == off }); i >= 0 {
			c.unpark(ks.waiting[i].m)
			ks.waiting = slices.Delete(ks.waiting, i, i+1)
		}
	}
	c.settleLocked(off, b)
	if revoked {
		c.unblockLocked(m)
	}
}

// revokeLocked takes an active lease back without ending a delivery: the
// message is settled by an operator. Like a lost lease, its credit slot
// stays until the consumer's PUBACK (already arrived for an explicit
// consumer: freed now).
func (p *partition) revokeLocked(l *Lease, k *kicks) {
	p.endLeaseLocked(l)
	if l.explicit && l.received && l.slot {
		p.freeSlotLocked(l, true, k)
	}
}

// commitLocked appends the writes of b to the logs of their partitions,
// synced, and returns a function that waits for them. Call the function
// after releasing the queue's locks: completing an append takes them.
func (q *Queue) commitLocked(b *Batch) func(context.Context) error {
	per := b.ByPartition()
	errc := make(chan error, len(per))
	for i, x := range per {
		p := q.partitions()[i]
		p.log.Append(p.epoch, nil, x, true, func(err error) { errc <- err })
	}
	return waitFor(errc, len(per))
}

// waitFor returns a function that waits for n results on errc and joins
// their errors.
func waitFor(errc <-chan error, n int) func(context.Context) error {
	return func(ctx context.Context) error {
		var errs []error
		for range n {
			select {
			case err := <-errc:
				errs = append(errs, err)
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		return errors.Join(errs...)
	}
}

// Declare creates the queue name with the settings o, or changes the
// settings of an existing queue to o, and records them so that they
// survive a restart (where they take precedence over the config file's).
// The partition count of an existing queue cannot change
// (ErrPartitionsChanged). A change applies at once: to deliveries from
// then on (ack_timeout, max_deliveries, backoff), to consumers that
// subscribe from then on (prefetch), to publishes from then on (durability,
// limits). Switching ordering away from key releases the messages parked
// behind their keys. It reports whether it created the queue.
func (m *Manager) Declare(ctx context.Context, name string, o Options) (*Queue, bool, error) {
	if !ValidQueueName(name) {
		return nil, false, fmt.Errorf("%w: %q", ErrInvalidName, name)
	}
	if err := o.Validate(); err != nil {
		return nil, false, err
	}
	m.admin.Lock()
	defer m.admin.Unlock()
	q, created, err := m.create(ctx, name, func(ctx context.Context) error {
		return m.persistDeclared(ctx, name, o, OwnerFrom(ctx), nil, true)
	}, o)
	if err != nil {
		return nil, false, err
	}
	if created {
		m.log.Info("queue declared", "queue", name, "partitions", o.Partitions, "ordering", o.Ordering, "durability", o.Durability)
		return q, true, nil
	}
	if n := len(q.partitions()); n > o.Partitions {
		return nil, false, fmt.Errorf("%w: queue %q has %d partitions, asked for %d: a queue's partitions can grow, not shrink", ErrPartitionsChanged, name, n, o.Partitions)
	} else if n < o.Partitions {
		if err := m.grow(ctx, q, o, true); err != nil {
			return nil, false, err
		}
	}
	// A growth whose new partitions were recorded but not all served (a
	// storage error) is served now: acquiring a served partition is a no-op.
	if err := m.acquireAll(q); err != nil {
		return nil, false, err
	}
	if err := m.persistDeclared(ctx, name, o, q.owner, q.growths, false); err != nil {
		return nil, false, err
	}
	q.setOptions(o)
	q.dlq.setOptions(dlqOptions(o))
	m.log.Info("queue settings changed", "queue", name, "ordering", o.Ordering, "durability", o.Durability,
		"ack_timeout", o.AckTimeout, "max_deliveries", o.MaxDeliveries, "prefetch", o.Prefetch)
	return q, false, nil
}

// persistDeclared durably records the queue's declared settings (and, for
// a new queue, its dead-letter queue).
func (m *Manager) persistDeclared(ctx context.Context, name string, o Options, owner string, growths []Growth, withDLQ bool) error {
	decl := o
	metas := []QueueMeta{{Name: name, Partitions: o.Partitions, Declared: &decl, Owner: owner, Growths: growths}}
	if withDLQ {
		metas = append(metas, QueueMeta{Name: DLQName(name), Partitions: o.Partitions})
	}
	return m.logs.SaveQueues(ctx, metas)
}

// dlqOptions are the settings of the dead-letter queue of a queue with
// settings o, as Manager.build gives them: its parent's, but a full
// dead-letter queue drops its oldest rather than refusing a dead letter.
func dlqOptions(o Options) Options {
	if o.MaxMessages > 0 || o.MaxBytes > 0 {
		o.Overflow = OverflowDropOldest
	}
	// A dead letter goes once settled, whatever the queue keeps.
	o.Retention = RetentionAcked
	return o
}

// setOptions replaces the queue's settings.
func (q *Queue) setOptions(o Options) {
	q.lockAll()
	defer q.unlockAll()
	old := q.opts
	q.opts = o
	q.retention.Store(limitsOf(o))
	if old.Ordering == OrderKey && o.Ordering != OrderKey {
		for _, g := range q.groups {
			for _, cur := range g.cursors {
				for _, ks := range cur.keys {
					for _, pd := range ks.waiting {
						if m := pd.m; pd.at.IsZero() && !m.NotBefore.IsZero() && m.NotBefore.After(q.m.now()) {
							pd.at = m.NotBefore
						}
						if !pd.at.IsZero() {
							cur.p.wantTickLocked()
							heap.Push(&cur.retries, pd)
							continue
						}
						heap.Push(&cur.ready, pd)
					}
				}
				for _, pd := range cur.pinned {
					pd.to = nil
					heap.Push(&cur.ready, pd)
				}
				cur.pinned = nil
				clear(cur.keys)
				cur.parked, cur.parkedBytes = 0, 0
			}
		}
	}
	for _, g := range q.groups {
		g.rebalance()
	}
	q.dispatchAllLocked(q.m.now())
}

// DeclaredAtRuntime returns the names of the queues whose settings were
// set with Declare.
func (m *Manager) DeclaredAtRuntime() (map[string]bool, error) {
	metas, err := m.logs.Queues()
	if err != nil {
		return nil, storageError(err)
	}
	out := map[string]bool{}
	for _, meta := range metas {
		if meta.Declared != nil {
			out[meta.Name] = true
		}
	}
	return out, nil
}

// DeleteQueue removes the queue name with its consumer groups and its
// dead-letter queue. Their consumers are cut off: the messages they hold
// are taken back (their late settlements change nothing) and nothing more
// is delivered to them; publishes still in flight to the old queue fail
// with ErrClosed. Every message, every group's state and the dedup-ids of
// both queues are deleted from storage and the queues are removed from the
// catalog, durably, before it returns. Meanwhile a publish or subscribe to
// the name waits; afterwards it creates the queue anew, empty (declared in
// the config: with the config's settings; else if auto_create is on). A
// queue declared in the config file comes back, empty, at the next start.
func (m *Manager) DeleteQueue(ctx context.Context, name string) error {
	return m.deleteQueue(ctx, name, false)
}

// ForgetQueue removes the queue name and its dead-letter queue from this
// node, as DeleteQueue does, but erases what this node stores of their
// partitions straight from its local storage (LocalLog), without the
// partitions' own logs, which may replicate or fence their writes: a
// cluster deleting the queue everywhere, each node forgetting its copy.
// ErrNoSuchQueue when this node does not have it.
func (m *Manager) ForgetQueue(ctx context.Context, name string) error {
	return m.deleteQueue(ctx, name, true)
}

// LocalLog is a Log that replicates or fences the writes made through it
// and keeps the partition's local copy in Local.
type LocalLog interface {
	Local() Log
}

// localOf returns the log holding the partition's copy on this node.
func localOf(l Log) Log {
	for {
		ll, ok := l.(LocalLog)
		if !ok {
			return l
		}
		l = ll.Local()
	}
}

func (m *Manager) deleteQueue(ctx context.Context, name string, local bool) error {
	if !ValidQueueName(name) {
		return fmt.Errorf("%w: %q", ErrInvalidName, name)
	}
	m.admin.Lock()
	defer m.admin.Unlock()
	m.mu.Lock()
	if m.closed {
		m.mu.Unlock()
		return ErrClosed
	}
	q := m.queues[name]
	if q == nil {
		m.mu.Unlock()
		return fmt.Errorf("%w: %s", ErrNoSuchQueue, name)
	}
	// Creating the name again waits for the deletion, as for a queue
	// being created (see create).
	done := make(chan struct{})
	m.creating[name] = done
	delete(m.queues, name)
	delete(m.queues, q.dlq.name)
	m.mu.Unlock()
	defer func() {
		m.mu.Lock()
		delete(m.creating, name)
		m.mu.Unlock()
		close(done)
	}()
	var k kicks
	var messages uint64
	var waits []func(context.Context) error
	for _, x := range []*Queue{q, q.dlq} {
		n, wait := x.dropLocked(&k, local)
		if x == q {
			messages = n
		}
		waits = append(waits, wait)
	}
	k.run()
	for _, wait := range waits {
		if err := wait(ctx); err != nil {
			return err
		}
	}
	if err := m.logs.DropQueues(ctx, []string{name, DLQName(name)}); err != nil {
		return storageError(err)
	}
	m.log.Info("queue deleted", "queue", name, "messages", messages, "here_only", local)
	return nil
}

// eraseLocal submits the erasure of what this node stores of each of the
// queue's partitions to its local log, fenced so that no write in flight
// through it lands afterwards, and returns a function that waits for it
// to be durable (q's locks held).
func (q *Queue) eraseLocal() func(context.Context) error {
	errc := make(chan error, len(q.partitions()))
	for _, p := range q.partitions() {
		l := localOf(p.log)
		id := PartitionID{Queue: q.name, Partition: p.index}
		if err := l.Fence(math.MaxUint64); err != nil {
			errc <- err
			continue
		}
		l.Append(math.MaxUint64, nil, &Batch{Erase: []PartitionID{id}}, true, func(err error) { errc <- err })
	}
	return waitFor(errc, len(q.partitions()))
}

// dropLocked closes the queue for good and submits the deletion of
// everything it stored: its messages up to the next offset (appends in
// flight are queued before the delete in each partition's log), every
// group's state and its dedup-ids. It takes and releases every lock of the
// queue itself; the name means the caller holds Manager.admin. It returns
// how many messages the queue held and a function that waits for the
// deletion to be durable.
func (q *Queue) dropLocked(k *kicks, local bool) (uint64, func(context.Context) error) {
	q.lockAll()
	defer q.unlockAll()
	var held uint64
	b := new(Batch)
	for _, p := range q.partitions() {
		for _, l := range p.leasesWhere(func(*Lease) bool { return true }) {
			p.revokeLocked(l, k)
		}
		if p.next > 0 {
			held += p.next - p.first
			b.Deletes = append(b.Deletes, RangeDelete{Queue: q.name, Partition: p.index, From: p.first, To: p.next})
		}
		for g := range q.groups {
			b.DropGroups = append(b.DropGroups, GroupRef{Queue: q.name, Group: g, Partition: p.index})
		}
	}
	q.dedupMu.Lock()
	for _, e := range q.dedup.byID {
		if !e.failed {
			b.Dedups = append(b.Dedups, DedupMark{Queue: q.name, Partition: e.partition, ID: e.id})
		}
	}
	q.dedupMu.Unlock()
	for _, g := range q.groups {
		for _, c := range g.consumers {
			c.closed = true
		}
		g.consumers = nil
	}
	var wait func(context.Context) error
	if local {
		wait = q.eraseLocal()
	} else {
		wait = q.commitLocked(b)
	}
	q.closed = true
	for _, p := range q.partitions() {
		p.owned = false // the timer leaves it alone
	}
	return held, wait
}
