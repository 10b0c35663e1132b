// Package queuetest holds what tests of the queue's storage seams share: an
// in-memory queue.Store with fault injection, and the conformance suite that
// every implementation of queue.Store must pass.
//
// # MemStore
//
// MemStore keeps every shard in maps guarded by one lock per shard. It copies
// messages on the way in and on the way out, so neither the writer nor a
// reader can change what is stored by mutating a *queue.Message. Times are
// kept to the millisecond, in UTC, like storage/badger keeps them, so that
// code tested against MemStore sees what production storage returns.
//
// Every write MemStore accepts is durable in the sense of the suite: Close
// keeps the data, and Reopen returns a new, open handle on the same data, the
// way reopening a data directory does.
//
// Faults are injected with FailWrites and FailNextWrites; a failed Write has
// no effect at all.
//
//	st := queuetest.NewMemStore(4)
//	st.FailNextWrites(1, io.ErrShortWrite) // the next Write, on any shard, fails
//
// # The conformance suite
//
// RunStoreSuite runs named sub-tests against a factory that opens a store on
// a directory; it calls the factory again on the same directory to test that
// data survives Close. A store that implements FaultInjector also runs the
// cases that need a failing Write.
//
//	func TestStoreSuite(t *testing.T) {
//		queuetest.RunStoreSuite(t, func(t *testing.T, dir string) queue.Store {
//			st, err := badger.Open(dir, badger.DefaultOptions())
//			if err != nil {
//				t.Fatal(err)
//			}
//			return st
//		})
//	}
//
// The suite asks for millisecond precision of message times and no more: it
// writes times with nanoseconds and compares them truncated to the
// millisecond.
package queuetest
