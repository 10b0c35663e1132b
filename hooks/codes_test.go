package hooks

import (
	"fmt"
	"testing"

	"github.com/mochi-mqtt/server/v2/packets"
	"github.com/shardq/shardq/queue"
)

// A publish refused for a full disk, wrapped or not, is answered 0x97.
func TestReasonForStorageFull(t *testing.T) {
	for _, err := range []error{queue.ErrStorageFull, fmt.Errorf("below watermark: %w", queue.ErrStorageFull)} {
		if got := reasonFor(err); got.Code != packets.ErrQuotaExceeded.Code {
			t.Fatalf("reasonFor(%v) = 0x%02x, want 0x97", err, got.Code)
		}
	}
}
