package broker

import (
	"log/slog"
	"net"
	"reflect"
	"testing"
	"time"

	mqtt "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/packets"

	"github.com/shardq/shardq/storage/badger"
)

func openSessions(t *testing.T, dir string) (*badger.Store, *sessionHook, map[string][]packets.UserProperty) {
	t.Helper()
	o := badger.DefaultOptions()
	o.Logger = slog.New(slog.DiscardHandler)
	o.MemTableSize = 4 << 20
	st, err := badger.Open(dir, o)
	if err != nil {
		t.Fatal(err)
	}
	restored := map[string][]packets.UserProperty{}
	h := newSessionHook(st.Sessions(), func(id, filter string, props []packets.UserProperty) {
		restored[id+" "+filter] = props
	}, slog.New(slog.DiscardHandler))
	return st, h, restored
}

// testClient is a mochi client on a connection, as a connected client is.
func testClient(t *testing.T, srv *mqtt.Server, id string, version byte, clean bool, expiry uint32) *mqtt.Client {
	a, b := net.Pipe()
	t.Cleanup(func() { a.Close(); b.Close() })
	cl := srv.NewClient(a, "mqtt", id, false)
	cl.Properties.ProtocolVersion = version
	cl.Properties.Clean = clean
	cl.Properties.Username = []byte("user-" + id)
	cl.Properties.Props.SessionExpiryInterval = expiry
	cl.Properties.Props.SessionExpiryIntervalFlag = expiry > 0
	return cl
}

func TestSessionRecordsRoundTrip(t *testing.T) {
	dir := t.TempDir()
	st, h, _ := openSessions(t, dir)
	srv := mqtt.New(&mqtt.Options{Logger: slog.New(slog.DiscardHandler)})

	kept := testClient(t, srv, "kept", 5, false, 3600)
	h.OnSessionEstablished(kept, packets.Packet{})
	old := testClient(t, srv, "old311", 4, false, 0)
	h.OnSessionEstablished(old, packets.Packet{})
	gone := testClient(t, srv, "gone", 5, false, 60)
	h.OnSessionEstablished(gone, packets.Packet{})
	clean := testClient(t, srv, "clean", 5, true, 0)
	h.OnSessionEstablished(clean, packets.Packet{Connect: packets.ConnectParams{Clean: true}})

	props := []packets.UserProperty{{Key: "ack", Val: "explicit"}}
	sub := packets.Packet{Filters: packets.Subscriptions{
		{Filter: "cmd/kept", Qos: 1, NoLocal: true, Identifier: 7},
		{Filter: "$share/g/$queue/jobs", Qos: 1},
		{Filter: "denied/#", Qos: 1},
	}, Properties: packets.Properties{User: props}}
	h.OnSubscribed(kept, sub, []byte{1, 1, packets.ErrNotAuthorized.Code})
	h.OnSubscribed(clean, packets.Packet{Filters: packets.Subscriptions{{Filter: "x"}}}, []byte{0})

	msg := packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Publish, Qos: 1}, TopicName: "cmd/kept",
		Payload: []byte("p1"), PacketID: 3, Created: 100, Properties: packets.Properties{ContentType: "text/plain"}}
	h.OnQosPublish(kept, msg, 100, 0)
	acked := msg
	acked.PacketID, acked.Payload = 4, []byte("p2")
	h.OnQosPublish(kept, acked, 100, 0)
	h.OnQosComplete(kept, packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Puback}, PacketID: 4})
	queued := msg
	queued.TopicName = "$queue/jobs"
	h.OnQosPublish(kept, queued, 100, 0) // queue deliveries are the queue's

	ret := packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Publish, Retain: true, Qos: 1},
		TopicName: "status/kept", Payload: []byte("online"), Created: 50}
	h.OnRetainMessage(kept, ret, 1)
	cleared := ret
	cleared.TopicName = "status/other"
	h.OnRetainMessage(kept, cleared, 1)
	h.OnRetainMessage(kept, cleared, -1)

	// gone left two minutes ago with a one-minute expiry.
	h.now = func() time.Time { return time.Now().Add(-2 * time.Minute) }
	h.OnDisconnect(gone, nil, false)
	if err := st.Close(); err != nil {
		t.Fatal(err)
	}

	st, h, restored := openSessions(t, dir)
	defer st.Close()
	clients, err := h.StoredClients()
	if err != nil {
		t.Fatal(err)
	}
	ids := map[string]string{}
	for _, c := range clients {
		ids[c.ID] = string(c.Username)
		if c.ID == "kept" && (c.ProtocolVersion != 5 || c.Properties.SessionExpiryInterval != 3600 || c.Clean || c.Listener != "mqtt") {
			t.Errorf("kept restored as %+v", c)
		}
	}
	if want := map[string]string{"kept": "user-kept", "old311": "user-old311"}; !reflect.DeepEqual(ids, want) {
		t.Errorf("restored clients %v, want %v", ids, want)
	}
	subs, err := h.StoredSubscriptions()
	if err != nil {
		t.Fatal(err)
	}
	var filters []string
	for _, s := range subs {
		filters = append(filters, s.Client+" "+s.Filter)
		if s.Filter == "cmd/kept" && (!s.NoLocal || s.Identifier != 7 || s.Qos != 1) {
			t.Errorf("subscription restored as %+v", s)
		}
	}
	if want := []string{"kept $share/g/$queue/jobs", "kept cmd/kept"}; !reflect.DeepEqual(filters, want) {
		t.Errorf("restored subscriptions %q, want %q", filters, want)
	}
	if want := map[string][]packets.UserProperty{"kept $share/g/$queue/jobs": props}; !reflect.DeepEqual(restored, want) {
		t.Errorf("queue subscription properties %v, want %v", restored, want)
	}
	inflight, err := h.StoredInflightMessages()
	if err != nil {
		t.Fatal(err)
	}
	if len(inflight) != 1 || inflight[0].Client != "kept" || inflight[0].PacketID != 3 ||
		string(inflight[0].Payload) != "p1" || inflight[0].Properties.ContentType != "text/plain" {
		t.Fatalf("restored inflight %+v", inflight)
	}
	if pk := inflight[0].ToPacket(); pk.TopicName != "cmd/kept" || pk.FixedHeader.Qos != 1 {
		t.Errorf("inflight packet %+v", pk)
	}
	retained, err := h.StoredRetainedMessages()
	if err != nil {
		t.Fatal(err)
	}
	if len(retained) != 1 || retained[0].TopicName != "status/kept" || string(retained[0].Payload) != "online" || !retained[0].FixedHeader.Retain {
		t.Errorf("restored retained %+v", retained)
	}

	// A clean start drops the stored session and what it held.
	again := testClient(t, srv, "kept", 5, true, 0)
	h.OnSessionEstablished(again, packets.Packet{Connect: packets.ConnectParams{Clean: true}})
	if c, _ := h.StoredClients(); len(c) != 1 || c[0].ID != "old311" {
		t.Errorf("after kept's clean start: %+v", c)
	}
	if s, _ := h.StoredSubscriptions(); len(s) != 0 {
		t.Errorf("subscriptions after the clean start: %+v", s)
	}
}

// A record that cannot be decoded is skipped, not a reason to refuse to
// start; an unreadable session is removed with what it held.
func TestUnreadableSessionRecordsAreSkipped(t *testing.T) {
	st, h, _ := openSessions(t, t.TempDir())
	defer st.Close()
	if err := st.Sessions().Write(
		badger.SessionWrite{Record: badger.SessionClient, Owner: "bad", Value: []byte("{not json")},
		badger.SessionWrite{Record: badger.SessionSubscription, Owner: "bad", Name: "a", Value: []byte("{}")},
		badger.SessionWrite{Record: badger.SessionRetained, Owner: "t", Value: []byte("[")},
	); err != nil {
		t.Fatal(err)
	}
	if c, err := h.StoredClients(); err != nil || len(c) != 0 {
		t.Errorf("StoredClients = %+v, %v", c, err)
	}
	if s, err := h.StoredSubscriptions(); err != nil || len(s) != 0 {
		t.Errorf("StoredSubscriptions = %+v, %v", s, err)
	}
	if r, err := h.StoredRetainedMessages(); err != nil || len(r) != 0 {
		t.Errorf("StoredRetainedMessages = %+v, %v", r, err)
	}
	n := 0
	_ = st.Sessions().Scan(badger.SessionSubscription, func(string, string, []byte) error { n++; return nil })
	if n != 0 {
		t.Errorf("%d subscription records of the unreadable session left", n)
	}
}
