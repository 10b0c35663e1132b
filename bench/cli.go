package bench

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"runtime/pprof"
	"strings"
	"time"
)

// Exit codes of Main.
const (
	ExitOK      = 0 // every run valid
	ExitInvalid = 1 // a run failed, or lost or reordered messages
	ExitUsage   = 2 // bad arguments
)

const usageText = `usage: bench SCENARIO --broker HOST:PORT [flags]

Scenarios:
  pubsub    plain topic bench/{run}, QoS 1, P producers, C subscribers (shared
            subscription $share/bench/bench/{run} when C > 1); any broker
  produce   publish to $queue/bench-{run} with no consumer; PUBACK latency
  cycle     produce to $queue/bench-{run}, consume in group bench with manual PUBACKs
  fanin     cycle with many producers (default 64) and one group of C consumers
  backlog   fill --messages (or --duration) with no consumer, then drain

Compare: --vs HOST:PORT runs the scenario against --broker (A) and --vs (B)
alternately for --rounds rounds and prints the A/B throughput ratios.

Flags:
`

// cliOptions are the parsed command line.
type cliOptions struct {
	cfg    Config
	vs     string
	vsPID  int
	rounds int
	json   bool
	// cpuProfile, when set, is where the load generator writes its own CPU
	// profile: the client side of a run costs CPU on the same machine.
	cpuProfile string
}

// Main runs the command line `bench SCENARIO --broker HOST:PORT [flags]`
// and returns the process exit code: ExitOK, ExitInvalid (a run failed or
// was invalid) or ExitUsage. Results go to stdout; errors and usage to
// stderr. A progress line is drawn on stdout when it is a terminal and
// --json is not set.
//
// --json prints one Result object for a single run, {"a": [...]} for
// several rounds against one broker, and a Comparison
// ({"a", "b", "ratios", "ratio_median"}) with --vs.
func Main(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	opts, err := parseArgs(args, stderr)
	if errors.Is(err, flag.ErrHelp) {
		return ExitOK
	}
	if err != nil {
		fmt.Fprintln(stderr, "bench:", err)
		return ExitUsage
	}
	if !opts.json && isTerminal(stdout) {
		opts.cfg.Progress = progressLine(stdout)
	}
	if opts.cpuProfile != "" {
		f, err := os.Create(opts.cpuProfile)
		if err == nil {
			err = pprof.StartCPUProfile(f)
		}
		if err != nil {
			fmt.Fprintln(stderr, "bench: cpu profile:", err)
			return ExitUsage
		}
		defer func() {
			pprof.StopCPUProfile()
			f.Close()
		}()
	}
	if opts.vs == "" {
		return runRounds(ctx, opts, stdout, stderr)
	}
	return runCompare(ctx, opts, stdout, stderr)
}

// runRounds runs the scenario against one broker --rounds times.
func runRounds(ctx context.Context, opts cliOptions, stdout, stderr io.Writer) int {
	var results []*Result
	code := ExitOK
	for round := 1; round <= opts.rounds; round++ {
		res, err := Run(ctx, opts.cfg)
		clearProgress(stdout, opts.cfg.Progress)
		if err != nil {
			fmt.Fprintln(stderr, "bench:", err)
			return ExitInvalid
		}
		if opts.rounds > 1 {
			res.Round = round
		}
		if !res.Valid {
			code = ExitInvalid
		}
		results = append(results, res)
		if !opts.json {
			if round > 1 {
				fmt.Fprintln(stdout)
			}
			if err := res.WriteText(stdout); err != nil {
				fmt.Fprintln(stderr, "bench:", err)
				return ExitInvalid
			}
		}
	}
	if opts.json {
		var v any = results[0]
		if len(results) > 1 {
			v = struct {
				A []*Result `json:"a"`
			}{results}
		}
		if err := writeJSON(stdout, v); err != nil {
			fmt.Fprintln(stderr, "bench:", err)
			return ExitInvalid
		}
	}
	return code
}

// runCompare runs the scenario against --broker and --vs alternately.
func runCompare(ctx context.Context, opts cliOptions, stdout, stderr io.Writer) int {
	b := opts.cfg
	b.Broker, b.BrokerPID, b.ConsumeBroker = opts.vs, opts.vsPID, ""
	cmp, err := Compare(ctx, opts.cfg, b, CompareOptions{
		Rounds: opts.rounds,
		OnResult: func(side string, round int, r *Result) {
			clearProgress(stdout, opts.cfg.Progress)
			if !opts.json {
				tp := r.Status
				if r.Throughput != nil {
					tp = count(int64(*r.Throughput)) + " msgs/s"
				}
				fmt.Fprintf(stdout, "round %d %s: %s  %s\n", round, side, r.Broker, tp)
			}
		},
	})
	clearProgress(stdout, opts.cfg.Progress)
	if err != nil {
		fmt.Fprintln(stderr, "bench:", err)
		return ExitInvalid
	}
	if opts.json {
		err = writeJSON(stdout, cmp)
	} else {
		fmt.Fprintln(stdout)
		err = cmp.WriteText(stdout)
	}
	if err != nil {
		fmt.Fprintln(stderr, "bench:", err)
		return ExitInvalid
	}
	for i := range cmp.A {
		if !cmp.A[i].Valid || !cmp.B[i].Valid {
			return ExitInvalid
		}
	}
	return ExitOK
}

// parseArgs parses `SCENARIO [flags]`; the scenario may also follow the
// flags.
func parseArgs(args []string, stderr io.Writer) (cliOptions, error) {
	cfg := DefaultConfig()
	cfg.Scenario = "" // required on the command line
	opts := cliOptions{}
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprint(stderr, usageText)
		fs.PrintDefaults()
	}

	fs.StringVar(&cfg.Broker, "broker", "", "broker `HOST:PORT` (A in a comparison); a comma-separated list spreads the producers over a cluster's nodes")
	fs.StringVar(&cfg.ConsumeBroker, "consume-broker", "", "where the consumers connect, `HOST:PORT[,...]` in turn (default --broker)")
	fs.StringVar(&opts.vs, "vs", "", "compare against this broker `HOST:PORT` (B)")
	fs.IntVar(&cfg.Producers, "producers", cfg.Producers, "producer connections (fanin: 64)")
	fs.IntVar(&cfg.Consumers, "consumers", cfg.Consumers, "consumer connections, one group")
	fs.IntVar(&cfg.Size, "size", cfg.Size, fmt.Sprintf("payload `bytes`, at least %d", HeaderSize))
	qos := fs.Uint("qos", uint(cfg.QoS), "QoS of publishes and subscriptions: 0, 1 or 2")
	fs.IntVar(&cfg.Window, "window", cfg.Window, "unacknowledged publishes in flight per producer")
	fs.Float64Var(&cfg.Rate, "rate", cfg.Rate, "total publish rate in `msgs/s`; 0 saturates")
	fs.DurationVar(&cfg.Duration, "duration", cfg.Duration, "measured publishing time, after the warm-up")
	fs.DurationVar(&cfg.Warmup, "warmup", cfg.Warmup, "publishing time excluded from the figures")
	fs.IntVar(&opts.rounds, "rounds", 0, "runs per broker (default 3 with --vs, else 1)")
	fs.IntVar(&cfg.Keys, "keys", cfg.Keys, "distinct values of the key user property, over all producers")
	fs.BoolVar(&cfg.OrderingCheck, "ordering-check", false, "a run with per-key reordering is invalid")
	fs.BoolVar(&opts.json, "json", false, "print JSON instead of tables")
	fs.IntVar(&cfg.Messages, "messages", 0, "total messages to publish (0: for --duration); backlog fill size")
	fs.DurationVar(&cfg.Drain, "drain", cfg.Drain, "wait for in-flight messages after producers stop (backlog: idle bound)")
	fs.IntVar(&cfg.BrokerPID, "broker-pid", 0, "broker `PID`: report its resident memory and, over the measured window, the CPU it used per message")
	fs.IntVar(&opts.vsPID, "vs-pid", 0, "`PID` of the --vs broker")
	fs.DurationVar(&cfg.AckInterval, "ack-interval", cfg.AckInterval, "how often consumers flush PUBACKs")
	receiveMax := fs.Uint("receive-max", 0, "consumers' Receive Maximum (0: not sent)")
	fs.StringVar(&cfg.ConsumerClient, "consumer-client", ClientLean, "consumers' MQTT client: "+ClientLean+" (MQTT 5, this package's) or "+ClientPaho311+" (paho.mqtt.golang, MQTT 3.1.1)")
	fs.StringVar(&opts.cpuProfile, "cpuprofile", "", "write the load generator's CPU profile to `FILE`")
	fs.StringVar(&cfg.RunID, "run-id", "", "topic and client id suffix (default random per run)")
	fs.StringVar(&cfg.Subject, "subject", "", "queue scenarios: publish under this `SUBJECT` ($queue/bench-RUN/SUBJECT)")
	fs.StringVar(&cfg.Filter, "filter", "", "queue scenarios: the consumers' group subscribes with this subject `FILTER` ($share/bench/$queue/bench-RUN/FILTER)")

	if len(args) > 0 && !strings.HasPrefix(args[0], "-") {
		cfg.Scenario, args = Scenario(args[0]), args[1:]
	}
	if err := fs.Parse(args); err != nil {
		return opts, err
	}
	rest := fs.Args()
	if cfg.Scenario == "" && len(rest) > 0 {
		cfg.Scenario, rest = Scenario(rest[0]), rest[1:]
	}
	if len(rest) > 0 {
		return opts, fmt.Errorf("unexpected arguments %q", rest)
	}
	if cfg.Scenario == "" {
		fs.Usage()
		return opts, errors.New("no scenario given")
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	if cfg.Scenario == ScenarioFanIn && !set["producers"] {
		cfg.Producers = FanInProducers
	}
	if *qos > 2 {
		return opts, fmt.Errorf("%w: qos %d: want 0, 1 or 2", ErrInvalidConfig, *qos)
	}
	cfg.QoS = byte(*qos)
	if *receiveMax > 65535 {
		return opts, fmt.Errorf("%w: receive-max %d: want at most 65535", ErrInvalidConfig, *receiveMax)
	}
	cfg.ReceiveMaximum = uint16(*receiveMax)
	if opts.rounds == 0 {
		opts.rounds = 1
		if opts.vs != "" {
			opts.rounds = 3
		}
	}
	if opts.rounds < 1 {
		return opts, fmt.Errorf("%w: rounds %d: want at least 1", ErrInvalidConfig, opts.rounds)
	}
	if err := cfg.Validate(); err != nil {
		return opts, err
	}
	opts.cfg = cfg
	return opts, nil
}

func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	if err := enc.Encode(v); err != nil {
		return fmt.Errorf("write json: %w", err)
	}
	return nil
}

// isTerminal reports whether w is a character device such as a terminal.
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}

// progressLine redraws one status line on w with a carriage return.
func progressLine(w io.Writer) func(Progress) {
	return func(p Progress) {
		p99 := "-" // nothing measured yet: still warming up
		if p.P99 > 0 {
			p99 = fmt.Sprintf("%.3f ms", float64(p.P99)/float64(time.Millisecond))
		}
		fmt.Fprintf(w, "\r%6.1fs  %s sent/s  %s recv/s  p99 %s  total %s sent, %s recv\x1b[K",
			p.Elapsed.Seconds(), count(int64(p.SendRate)), count(int64(p.ReceiveRate)),
			p99, count(p.Sent), count(p.Received))
	}
}

// clearProgress erases the progress line, if one is drawn.
func clearProgress(w io.Writer, progress func(Progress)) {
	if progress != nil {
		fmt.Fprint(w, "\r\x1b[K")
	}
}
