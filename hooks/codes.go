package hooks

import (
	"errors"

	"github.com/mochi-mqtt/server/v2/packets"
	"github.com/shardq/shardq/queue"
)

// reasonFor maps a domain error to the MQTT v5 reason code a producer gets.
// This is the one table of that mapping.
func reasonFor(err error) packets.Code {
	switch {
	case err == nil:
		return packets.CodeSuccess
	case errors.Is(err, queue.ErrQueueFull), errors.Is(err, queue.ErrStorageFull), errors.Is(err, ErrQuotaExceeded):
		return packets.ErrQuotaExceeded
	case errors.Is(err, ErrNotAuthorized):
		return packets.ErrNotAuthorized
	case errors.Is(err, queue.ErrInvalidTopic), errors.Is(err, queue.ErrNoSuchQueue):
		return packets.ErrTopicNameInvalid
	case errors.Is(err, queue.ErrTooLarge):
		return packets.ErrPacketTooLarge
	case errors.Is(err, errBadProperty):
		return packets.ErrPayloadFormatInvalid
	case errors.Is(err, errNotYourMsg), errors.Is(err, errNoMsgID),
		errors.Is(err, queue.ErrNotLeased), errors.Is(err, queue.ErrUnknownMessage):
		return packets.ErrUnspecifiedError
	case errors.Is(err, queue.ErrFenced), errors.Is(err, queue.ErrNotOwned), errors.Is(err, queue.ErrStorage):
		// The partition moved or storage failed: safe to retry (with the
		// same dedup-id to be sure of storing it once).
		return packets.ErrImplementationSpecificError
	default:
		return packets.ErrImplementationSpecificError
	}
}

// withReason returns code with a reason string that says what went wrong.
func withReason(code packets.Code, err error) packets.Code {
	if err != nil {
		code.Reason = err.Error()
	}
	return code
}

// outcomeFor maps a consumer's PUBACK reason code to a settlement.
func outcomeFor(code byte) queue.Outcome {
	switch code {
	case packets.CodeSuccess.Code, packets.CodeNoMatchingSubscribers.Code:
		return queue.Ack
	case packets.ErrNotAuthorized.Code, packets.ErrPayloadFormatInvalid.Code:
		return queue.Reject
	default:
		return queue.Nack
	}
}

var errBadProperty = errors.New("hooks: invalid user property")
