package cluster

// PlainHandler is the broker's side of ordinary MQTT across nodes.
type PlainHandler interface{}
