package queue

import "context"

// ownerKey keys the owner of the queues a call may create in its context.
type ownerKey struct{}

// WithOwner returns ctx saying that a queue created by a call with it
// belongs to owner (a tenant: the MQTT username of the client whose
// publish or subscription created it). The owner is recorded with the
// queue and survives restarts.
func WithOwner(ctx context.Context, owner string) context.Context {
	if owner == "" {
		return ctx
	}
	return context.WithValue(ctx, ownerKey{}, owner)
}

// OwnerFrom returns the owner WithOwner put in ctx, or "".
func OwnerFrom(ctx context.Context) string {
	s, _ := ctx.Value(ownerKey{}).(string)
	return s
}

// Bytes returns the bytes the queue's partitions on this node hold.
func (q *Queue) Bytes() int64 { return q.bytes.Load() }

// Owner returns the tenant that created the queue ("" for a queue
// declared, created through the admin API, or by an anonymous client).
func (q *Queue) Owner() string { return q.owner }
