package broker

import (
	"net/http"
	"slices"
	"strings"
	"time"
)

// RetainedList answers GET /api/v1/retained: the retained messages of
// plain topics this node holds, $SYS/ left out (in a cluster every node holds all of
// them: docs/adr/0010), sorted by topic.
type RetainedList struct {
	Node string `json:"node"`
	// Total counts the retained messages matching; Messages holds at
	// most the limit asked for.
	Total    int            `json:"total"`
	Messages []RetainedView `json:"messages"`
}

// RetainedView is one retained message.
type RetainedView struct {
	Topic      string     `json:"topic"`
	QoS        byte       `json:"qos"`
	Size       int        `json:"size"`
	RetainedAt *time.Time `json:"retained_at,omitempty"`
	Payload    []byte     `json:"payload"`
}

// maxRetained bounds the messages one listing returns.
const maxRetained = 10000

// listRetained serves GET /api/v1/retained: ?prefix= keeps the topics
// that start with it, ?limit= (1 to 10000, default 1000) bounds the list.
func (a *adminAPI) listRetained(w http.ResponseWriter, r *http.Request) {
	qv := r.URL.Query()
	limit, err := intParam(qv.Get("limit"), "limit", 1000, 1, maxRetained)
	if err != nil {
		a.fail(w, r, http.StatusBadRequest, err)
		return
	}
	prefix := qv.Get("prefix")
	out := RetainedList{Node: a.b.cfg.NodeID, Messages: []RetainedView{}}
	for topic, pk := range a.b.server.Topics.Retained.GetAll() {
		if !strings.HasPrefix(topic, prefix) || strings.HasPrefix(topic, "$") {
			continue // $SYS/...: mochi's figures, not the clients' messages
		}
		out.Total++
		v := RetainedView{Topic: topic, QoS: pk.FixedHeader.Qos, Size: len(pk.Payload), Payload: pk.Payload}
		if pk.Created > 0 {
			at := time.Unix(pk.Created, 0).UTC()
			v.RetainedAt = &at
		}
		out.Messages = append(out.Messages, v)
	}
	slices.SortFunc(out.Messages, func(x, y RetainedView) int { return strings.Compare(x.Topic, y.Topic) })
	if len(out.Messages) > limit {
		out.Messages = out.Messages[:limit]
	}
	a.reply(w, http.StatusOK, out)
}
