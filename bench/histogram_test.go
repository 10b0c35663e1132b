package bench

import (
	"math"
	"sync"
	"testing"
	"time"
)

func TestHistogramPercentiles(t *testing.T) {
	type want struct {
		q float64
		v time.Duration
	}
	cases := []struct {
		name   string
		record func(h *Histogram)
		wants  []want
		// tolerance is the allowed relative error; 0 means exact.
		tolerance float64
	}{
		{
			name: "uniform 1us to 100ms",
			record: func(h *Histogram) {
				for v := 1; v <= 100_000; v++ {
					h.Record(time.Duration(v) * time.Microsecond)
				}
			},
			wants: []want{
				{50, 50 * time.Millisecond},
				{90, 90 * time.Millisecond},
				{99, 99 * time.Millisecond},
				{99.9, 99900 * time.Microsecond},
				{100, 100 * time.Millisecond},
			},
			tolerance: 0.01,
		},
		{
			name: "small values are exact",
			record: func(h *Histogram) {
				for v := 1; v <= 200; v++ {
					h.Record(time.Duration(v) * time.Microsecond)
				}
			},
			wants: []want{{50, 100 * time.Microsecond}, {90, 180 * time.Microsecond}, {99, 198 * time.Microsecond}, {100, 200 * time.Microsecond}},
		},
		{
			name: "constant",
			record: func(h *Histogram) {
				for range 1000 {
					h.Record(5 * time.Millisecond)
				}
			},
			wants:     []want{{50, 5 * time.Millisecond}, {99.9, 5 * time.Millisecond}, {100, 5 * time.Millisecond}},
			tolerance: 0.01,
		},
		{
			name: "bimodal tail",
			record: func(h *Histogram) {
				for range 990 {
					h.Record(time.Millisecond)
				}
				for range 10 {
					h.Record(time.Second)
				}
			},
			wants:     []want{{50, time.Millisecond}, {99, time.Millisecond}, {99.9, time.Second}, {100, time.Second}},
			tolerance: 0.01,
		},
		{
			name: "beyond 60s keeps the exact max",
			record: func(h *Histogram) {
				h.Record(time.Millisecond)
				h.Record(90 * time.Second)
			},
			wants:     []want{{50, time.Millisecond}, {100, 90 * time.Second}},
			tolerance: 0.01,
		},
		{
			name: "negative counts as zero",
			record: func(h *Histogram) {
				h.Record(-time.Second)
			},
			wants: []want{{50, 0}, {100, 0}},
		},
		{
			name:   "empty",
			record: func(h *Histogram) {},
			wants:  []want{{50, 0}, {99.9, 0}},
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			h := NewHistogram()
			tc.record(h)
			for _, w := range tc.wants {
				got := h.Percentile(w.q)
				if !within(got, w.v, tc.tolerance) {
					t.Errorf("p%g = %v, want %v (tolerance %g)", w.q, got, w.v, tc.tolerance)
				}
			}
		})
	}
}

func within(got, want time.Duration, tolerance float64) bool {
	if tolerance == 0 {
		return got == want
	}
	return math.Abs(float64(got-want)) <= tolerance*float64(want)
}

// TestHistogramBuckets checks the bucket layout: every value maps into a
// bucket whose range contains it and is at most 1/128 of the value wide.
func TestHistogramBuckets(t *testing.T) {
	prev := -1
	for v := int64(0); v <= maxTrackable; v += 1 + v/1000 {
		i := bucketIndex(v)
		if i < prev {
			t.Fatalf("bucketIndex(%d) = %d, below bucketIndex of a smaller value (%d)", v, i, prev)
		}
		prev = i
		high := bucketHigh(i)
		if high < v {
			t.Fatalf("value %d in bucket %d whose highest value is %d", v, i, high)
		}
		if i > 0 && bucketHigh(i-1) >= v {
			t.Fatalf("value %d in bucket %d, but bucket %d reaches %d", v, i, i-1, bucketHigh(i-1))
		}
		if i > 0 {
			if width := high - bucketHigh(i-1); width > max(1, v/subBuckets) {
				t.Fatalf("bucket %d is %d wide for value %d", i, width, v)
			}
		}
	}
	if got := bucketIndex(maxTrackable); got != numBuckets-1 {
		t.Fatalf("bucketIndex(max) = %d, want the last bucket %d", got, numBuckets-1)
	}
}

func TestHistogramMergeAndConcurrentRecord(t *testing.T) {
	a, b := NewHistogram(), NewHistogram()
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Go(func() {
			for v := 1; v <= 1000; v++ {
				if g%2 == 0 {
					a.Record(time.Duration(v) * time.Microsecond)
				} else {
					b.Record(time.Duration(v) * time.Millisecond)
				}
			}
		})
	}
	wg.Wait()
	a.Merge(b)
	s := a.Summary()
	if s.Count != 4000 {
		t.Fatalf("count = %d, want 4000", s.Count)
	}
	if s.Max != time.Second {
		t.Fatalf("max = %v, want 1s", s.Max)
	}
	// Half the values are 1..1000 µs, half 1..1000 ms: the median is the
	// top of the microsecond half.
	if !within(s.P50, time.Millisecond, 0.01) {
		t.Fatalf("p50 = %v, want about 1ms", s.P50)
	}
	if !within(s.P90, 800*time.Millisecond, 0.01) {
		t.Fatalf("p90 = %v, want about 800ms", s.P90)
	}
}
