//go:build !unix

package badger

import "time"

// processCPU is not measured here.
func processCPU() time.Duration { return 0 }
