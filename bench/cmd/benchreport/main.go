// Command benchreport writes the markdown report of scripts/bench-compare.sh
// (docs/BENCHMARKS.md) from the results of `shardq bench --json`.
//
//	benchreport -o docs/BENCHMARKS.md -fsync fsync.json -fs ext4 \
//	    -run 'mochi=vanilla mochi, `pubsub`' -run 'shardq-none=shardq, `cycle`' \
//	    -ratio shardq-none/mochi@0.9 \
//	    mochi-r1.json shardq-none-r1.json mochi-r2.json shardq-none-r2.json
//
// Each result file is named NAME-rROUND.json: the -run it belongs to and
// the round. A file that is missing, empty or not a result is shown as an
// ERROR, with the first line of NAME-rROUND.err beside it when there is
// one. A ratio NUM/DEN is the throughput of NUM over that of DEN in the
// same round, where both runs are valid; cpu:NUM/DEN compares the
// broker's CPU per message instead (results of runs given --broker-pid)
// and p99:NUM/DEN the PUBACK p99, both lower is better. The report gives
// each round's ratio and their median, and @GOAL adds the target (at
// least it for throughput, at most it for the others).
//
// The machine line has the CPU model from /proc/cpuinfo, the core count
// and the Go version from the runtime (the one that built this program and
// the brokers), and the fsync percentiles from `fsyncprobe --json`.
package main

import (
	"flag"
	"fmt"
	"os"
	"strings"
	"time"
)

func main() {
	r := &report{date: time.Now().UTC(), machine: thisMachine()}
	out := flag.String("o", "", "write the report to `FILE` instead of stdout")
	fsync := flag.String("fsync", "", "`FILE` holding the output of fsyncprobe --json")
	flag.StringVar(&r.fsType, "fs", "", "file system `TYPE` fsyncprobe measured")
	flag.StringVar(&r.commit, "commit", "", "the shardq commit measured")
	flag.StringVar(&r.duration, "duration", "", "measured time of each run, as passed to shardq bench")
	flag.StringVar(&r.warmup, "warmup", "", "warm-up of each run, as passed to shardq bench")
	flag.Func("run", "`NAME=DESCRIPTION` of a run, in the order of the tables (repeatable)", func(s string) error {
		name, desc, ok := strings.Cut(s, "=")
		if !ok || name == "" {
			return fmt.Errorf("want NAME=DESCRIPTION, got %q", s)
		}
		r.runs = append(r.runs, &run{name: name, desc: desc, rounds: map[int]*outcome{}})
		return nil
	})
	flag.Func("ratio", "`[cpu:|p99:]NUM/DEN[@GOAL]`: throughput (or broker CPU per message, or PUBACK p99) of run NUM over run DEN (repeatable)", func(s string) error {
		q, err := parseRatio(s)
		r.ratios = append(r.ratios, q)
		return err
	})
	flag.Func("note", "`TEXT` to add under the machine and load lines (repeatable)", func(s string) error {
		r.notes = append(r.notes, s)
		return nil
	})
	flag.Func("attach", "`TITLE=FILE`: show FILE under Configuration (repeatable)", func(s string) error {
		title, file, ok := strings.Cut(s, "=")
		if !ok {
			return fmt.Errorf("want TITLE=FILE, got %q", s)
		}
		data, err := os.ReadFile(file)
		r.attachments = append(r.attachments, attachment{title: title, file: file, text: string(data)})
		return err
	})
	flag.Parse()

	if err := r.load(*fsync, flag.Args()); err != nil {
		fail(err)
	}
	if *out == "" {
		if err := r.write(os.Stdout); err != nil {
			fail(err)
		}
		return
	}
	f, err := os.Create(*out)
	if err != nil {
		fail(err)
	}
	if err := r.write(f); err != nil {
		fail(err)
	}
	if err := f.Close(); err != nil {
		fail(err)
	}
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "benchreport:", err)
	os.Exit(1)
}
