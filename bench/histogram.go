package bench

import (
	"math"
	"math/bits"
	"sync/atomic"
	"time"
)

// Histogram bucket layout: log-linear, in the manner of HdrHistogram.
//
// Values are whole microseconds. The first linearBuckets values (0 to 255 µs)
// have a bucket each. Above that, every power of two [2^k, 2^(k+1)) is split
// into subBuckets equal buckets, so a bucket is never wider than 1/128 of its
// lowest value: any reported value is within 0.8% of a recorded one.
// Values above maxTrackable (60 s) share the last bucket; Max stays exact.
const (
	subBucketBits = 7
	subBuckets    = 1 << subBucketBits // buckets per power of two above the linear range
	linearBuckets = 2 * subBuckets     // 0..255 µs, one bucket per µs

	maxTrackable = int64(60 * time.Second / time.Microsecond)
)

// numBuckets covers 0..maxTrackable: one group of subBuckets per power of two
// between linearBuckets and maxTrackable.
var numBuckets = bucketIndex(maxTrackable) + 1

// Histogram records durations with 1 µs resolution up to 60 s and about 1%
// precision, and answers percentile queries.
//
// Record, Merge and the queries are safe for concurrent use: counts are
// atomic, so a query while recording sees a consistent-enough snapshot
// (each bucket exact, the total possibly a few records ahead or behind).
// The zero value is not usable; call NewHistogram.
type Histogram struct {
	counts []atomic.Uint64
	total  atomic.Uint64
	sum    atomic.Int64 // µs, for the mean
	max    atomic.Int64 // µs, exact
}

// NewHistogram returns an empty histogram.
func NewHistogram() *Histogram {
	return &Histogram{counts: make([]atomic.Uint64, numBuckets)}
}

// bucketIndex maps a value in µs (0 <= v <= maxTrackable) to its bucket.
func bucketIndex(v int64) int {
	if v < linearBuckets {
		return int(v)
	}
	shift := bits.Len64(uint64(v)) - (subBucketBits + 1) // v>>shift is in [128, 256)
	return linearBuckets + (shift-1)*subBuckets + int(v>>shift) - subBuckets
}

// bucketHigh is the highest value that maps to bucket i.
func bucketHigh(i int) int64 {
	if i < linearBuckets {
		return int64(i)
	}
	j := i - linearBuckets
	shift := j/subBuckets + 1
	sub := int64(j%subBuckets + subBuckets)
	return (sub+1)<<shift - 1
}

// Record adds one observation. Negative durations (a wall clock stepping
// back) count as zero.
func (h *Histogram) Record(d time.Duration) {
	v := int64(d / time.Microsecond)
	if v < 0 {
		v = 0
	}
	for {
		m := h.max.Load()
		if v <= m || h.max.CompareAndSwap(m, v) {
			break
		}
	}
	h.sum.Add(v)
	if v > maxTrackable {
		v = maxTrackable
	}
	h.counts[bucketIndex(v)].Add(1)
	h.total.Add(1)
}

// Merge adds every observation of o to h.
func (h *Histogram) Merge(o *Histogram) {
	for i := range o.counts {
		if n := o.counts[i].Load(); n > 0 {
			h.counts[i].Add(n)
		}
	}
	h.total.Add(o.total.Load())
	h.sum.Add(o.sum.Load())
	om := o.max.Load()
	for {
		m := h.max.Load()
		if om <= m || h.max.CompareAndSwap(m, om) {
			break
		}
	}
}

// Count is the number of observations.
func (h *Histogram) Count() uint64 { return h.total.Load() }

// Max is the largest observation, exact to the microsecond.
func (h *Histogram) Max() time.Duration {
	return time.Duration(h.max.Load()) * time.Microsecond
}

// Mean is the average observation, or 0 when empty.
func (h *Histogram) Mean() time.Duration {
	n := h.total.Load()
	if n == 0 {
		return 0
	}
	return time.Duration(h.sum.Load()/int64(n)) * time.Microsecond
}

// Percentile returns the smallest value v such that at least q percent of
// the observations are <= v (to the bucket's precision), for 0 < q <= 100.
// It returns 0 when the histogram is empty.
func (h *Histogram) Percentile(q float64) time.Duration {
	total := h.total.Load()
	if total == 0 {
		return 0
	}
	q = math.Max(0, math.Min(100, q))
	rank := uint64(math.Ceil(q / 100 * float64(total)))
	if rank == 0 {
		rank = 1
	}
	max := h.max.Load()
	var seen uint64
	for i := range h.counts {
		seen += h.counts[i].Load()
		if seen >= rank {
			if i == len(h.counts)-1 { // holds everything above maxTrackable
				return time.Duration(max) * time.Microsecond
			}
			return time.Duration(min(bucketHigh(i), max)) * time.Microsecond
		}
	}
	return time.Duration(max) * time.Microsecond
}

// Summary is the usual set of percentiles.
func (h *Histogram) Summary() LatencySummary {
	return LatencySummary{
		Count: h.Count(),
		Mean:  h.Mean(),
		P50:   h.Percentile(50),
		P90:   h.Percentile(90),
		P99:   h.Percentile(99),
		P999:  h.Percentile(99.9),
		Max:   h.Max(),
	}
}

// LatencySummary is a snapshot of one histogram.
type LatencySummary struct {
	Count uint64
	Mean  time.Duration
	P50   time.Duration
	P90   time.Duration
	P99   time.Duration
	P999  time.Duration
	Max   time.Duration
}

// ms converts a duration to fractional milliseconds for reports.
func ms(d time.Duration) float64 {
	return float64(d) / float64(time.Millisecond)
}
