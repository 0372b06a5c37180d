// SPDX-License-Identifier: Apache-2.0

// The Go side of the peer suite: the same workloads on goroutines, stdlib
// only, GOMAXPROCS = number of CPUs (1 for the one-worker yield), plus the
// Go echo server (package net, a goroutine per connection, no net/http).
//
// Usage: "go-peer WORKLOAD [-n N] [-gap-us G] [-no-warmup] [-unpinned] [-cpu-split]", or
// "go-peer echo-server", which prints "PORT <n>" and serves until killed.
//
// Output: one JSON object per line, as the C++ peers print (see peers.py).
package main

import (
	"flag"
	"fmt"
	"net"
	"os"
	"runtime"
	"sort"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"
)

type figure struct {
	metric, unit string
	value        float64
}

func nsPerOp(t0 time.Time, ops float64) float64 { return float64(time.Since(t0).Nanoseconds()) / ops }

// Two goroutines on one P call runtime.Gosched; ns per yield.
func yieldPingPong(n int64, _ float64) []figure {
	prev := runtime.GOMAXPROCS(1)
	defer runtime.GOMAXPROCS(prev)
	var wg sync.WaitGroup
	body := func() {
		for i := int64(0); i < n; i++ {
			runtime.Gosched()
		}
		wg.Done()
	}
	t0 := time.Now()
	wg.Add(2)
	go body()
	go body()
	wg.Wait()
	return []figure{{"time", "ns/op", nsPerOp(t0, 2*float64(n))}}
}

// Start an empty goroutine and wait for it, n times in a row. Go has no join:
// the idiomatic wait is a WaitGroup (a channel close costs about the same).
func spawnJoin(n int64, _ float64) []figure {
	var wg sync.WaitGroup
	t0 := time.Now()
	for i := int64(0); i < n; i++ {
		wg.Add(1)
		go func() { wg.Done() }()
		wg.Wait()
	}
	return []figure{{"time", "ns/op", nsPerOp(t0, float64(n))}}
}

// Start n empty goroutines, then wait for all of them.
func spawnMany(n int64, _ float64) []figure {
	var wg sync.WaitGroup
	t0 := time.Now()
	wg.Add(int(n))
	for i := int64(0); i < n; i++ {
		go func() { wg.Done() }()
	}
	wg.Wait()
	return []figure{{"time", "ns/op", nsPerOp(t0, float64(n))}}
}

// skynet as Go programs write it: every node reports to its parent on a channel.
func skynet(out chan<- int64, num, size int64) {
	if size == 1 {
		out <- num
		return
	}
	child := size / 10
	results := make(chan int64, 10)
	for i := int64(0); i < 10; i++ {
		go skynet(results, num+i*child, child)
	}
	var sum int64
	for i := 0; i < 10; i++ {
		sum += <-results
	}
	out <- sum
}

func skynetWorkload(leaves int64, _ float64) []figure {
	out := make(chan int64, 1)
	t0 := time.Now()
	go skynet(out, 0, leaves)
	sum := <-out
	ns := nsPerOp(t0, float64(leaves))
	if sum != leaves*(leaves-1)/2 {
		fail("skynet: wrong sum")
	}
	return []figure{{"time", "ns/leaf", ns}}
}

// Unbuffered channel round trip between two goroutines. Go cannot pin a
// goroutine to a P, and a goroutine readied by a send runs next on the
// sender's P (runnext): here the receiver of the plain round trip runs on
// the sender's OS thread in 99.9 % of round trips. So the round trip
// across two workers locks client and server to threads pinned to CPUs 0 and
// 1 (lockToCPU), the only way Go has to keep the two apart; the plain one
// (channel_any) lets Go place them.
func channelRoundTrip(n int64, _ float64) []figure {
	return roundTrip(n, true)
}

func channelRoundTripAny(n int64, _ float64) []figure {
	return roundTrip(n, false)
}

// The same on one P (GOMAXPROCS=1): both goroutines on one worker.
func channelRoundTrip1w(n int64, _ float64) []figure {
	prev := runtime.GOMAXPROCS(1)
	defer runtime.GOMAXPROCS(prev)
	return roundTrip(n, false)
}

// Locks the calling goroutine to its OS thread and pins that thread to the
// which-th CPU (0 or 1) the process may run on; the returned function undoes
// both. A locked thread alone is not kept on a CPU: the kernel's wake-affine
// placement runs the woken goroutine's locked thread on its waker's CPU in
// 705-1,087 of 2,000 `wake` wake-ups (17.6-19.0 us p50 there, 37.9-43.8 us on
// the other CPU), so an unpinned lock does not measure a wake-up across CPUs,
// which coresched's pinned workers and the threads peer always pay.
//
// With -unpinned (the comparison that lets the kernel place Go's threads),
// only the woken goroutine (which = 1) is locked to its thread, and
// nothing is pinned.
var unpinned bool

var cpuSplit bool // -cpu-split (printCPUSplit)

var warmingUp bool // the warm-up run at a tenth of the size: -cpu-split reports only the measured run

func lockToCPU(which int) func() {
	if unpinned {
		if which == 0 {
			return func() {}
		}
		runtime.LockOSThread()
		return runtime.UnlockOSThread
	}
	runtime.LockOSThread()
	var all, one [16]uint64 // cpu_set_t, 1024 CPUs
	setaff := func(m *[16]uint64) {
		if _, _, e := syscall.RawSyscall(syscall.SYS_SCHED_SETAFFINITY, 0, unsafe.Sizeof(*m), uintptr(unsafe.Pointer(m))); e != 0 {
			fail("sched_setaffinity: " + e.Error())
		}
	}
	if _, _, e := syscall.RawSyscall(syscall.SYS_SCHED_GETAFFINITY, 0, unsafe.Sizeof(all), uintptr(unsafe.Pointer(&all))); e != 0 {
		fail("sched_getaffinity: " + e.Error())
	}
	cpu, seen := -1, 0
	for c := 0; c < 64*len(all) && cpu < 0; c++ {
		if all[c/64]&(1<<(c%64)) != 0 {
			if seen == which {
				cpu = c
			}
			seen++
		}
	}
	if cpu < 0 {
		fail("pinning two goroutines to two CPUs needs two CPUs in the affinity mask")
	}
	one[cpu/64] = 1 << (cpu % 64)
	setaff(&one)
	return func() {
		setaff(&all)
		runtime.UnlockOSThread()
	}
}

// Across two workers: the client (this goroutine) and the server locked to
// threads pinned to two CPUs (lockToCPU).
func roundTrip(n int64, pinned bool) []figure {
	ping, pong := make(chan int64), make(chan int64)
	if pinned {
		defer lockToCPU(0)()
	}
	go func() {
		if pinned {
			defer lockToCPU(1)()
		}
		for v := range ping {
			pong <- v + 1
		}
	}()
	t0 := time.Now()
	var x int64
	for i := int64(0); i < n; i++ {
		ping <- x
		x = <-pong
	}
	r := nsPerOp(t0, float64(n))
	close(ping)
	if x != n {
		fail("channel: wrong count")
	}
	return []figure{{"time", "ns/op", r}}
}

func spinFor(d time.Duration) {
	until := time.Now().Add(d)
	for time.Now().Before(until) {
	}
}

// A pauses gapUs, stamps and wakes B (blocked on a channel receive); B
// records the latency. wake locks A and B to threads pinned to CPUs 0 and 1,
// so the wake-up crosses CPUs (see channelRoundTrip and lockToCPU); wake_any
// lets Go place B, and Go runs it on A's thread (2,000 of 2,000 wake-ups
// here).
func wakeLatency(n int64, gapUs float64) []figure {
	return wakeLatencyOf(n, gapUs, true)
}

func wakeLatencyAny(n int64, gapUs float64) []figure {
	return wakeLatencyOf(n, gapUs, false)
}

// A producer and a consumer goroutine, each with 1 us of work per item,
// through a channel of 64: ns per item (see the coresched peer's pipeline).
func pipeline(n int64, _ float64) []figure {
	items := make(chan int64, 64)
	done := make(chan int64)
	t0 := time.Now()
	go func() {
		var sum int64
		for v := range items {
			spinFor(time.Microsecond)
			sum += v
		}
		done <- sum
	}()
	for i := int64(0); i < n; i++ {
		spinFor(time.Microsecond)
		items <- i
	}
	close(items)
	sum := <-done
	r := nsPerOp(t0, float64(n))
	if sum != n*(n-1)/2 {
		fail("pipeline: wrong sum")
	}
	return []figure{{"time", "ns/item", r}}
}

// As wake_any, but A runs on for 100 us after waking B before it waits for
// B's answer: the waker that does not block at once.
func wakeRunOn(n int64, gapUs float64) []figure {
	return wakeLatencyRun(n, gapUs, false, 100*time.Microsecond)
}

func wakeLatencyOf(n int64, gapUs float64, pinned bool) []figure {
	return wakeLatencyRun(n, gapUs, pinned, 0)
}

func wakeLatencyRun(n int64, gapUs float64, pinned bool, runOn time.Duration) []figure {
	toB, toA := make(chan time.Time, 1), make(chan int, 1)
	lat := make([]float64, 0, n)
	done := make(chan struct{})
	if pinned {
		defer lockToCPU(0)()
	}
	go func() {
		if pinned {
			defer lockToCPU(1)()
		}
		for i := int64(0); i < n; i++ {
			stamp := <-toB
			lat = append(lat, float64(time.Since(stamp).Nanoseconds())/1e3)
			cpu := -1
			if cpuSplit {
				cpu = getcpu()
			}
			toA <- cpu
		}
		close(done)
	}()
	gap := time.Duration(gapUs * 1000)
	same := make([]bool, n)
	for i := int64(0); i < n; i++ {
		spinFor(gap)
		cpu := -1
		if cpuSplit {
			cpu = getcpu()
		}
		toB <- time.Now()
		if runOn > 0 {
			spinFor(runOn)
		}
		same[i] = <-toA == cpu && cpu >= 0
	}
	<-done
	if cpuSplit && !warmingUp {
		printCPUSplit(lat, same)
	}
	sort.Float64s(lat)
	return []figure{{"p50", "us", percentile(lat, 50)}, {"p99", "us", percentile(lat, 99)}}
}

// percentile of sorted values.
func percentile(v []float64, p float64) float64 { return v[int(p/100*float64(len(v)-1)+0.5)] }

const sysGetcpu = 309 // getcpu(2) on x86-64; package syscall does not name it

// The CPU the calling thread runs on, or -1 (then no wake-up counts as on the waker's CPU).
func getcpu() int {
	if runtime.GOARCH != "amd64" {
		return -1
	}
	var cpu, node uint32
	if _, _, e := syscall.RawSyscall(sysGetcpu, uintptr(unsafe.Pointer(&cpu)), uintptr(unsafe.Pointer(&node)), 0); e != 0 {
		return -1
	}
	return int(cpu)
}

// -cpu-split: how many wake-ups ran the woken goroutine on the CPU its waker
// was on just before the send, and the p50 of each kind (on stderr).
func printCPUSplit(lat []float64, same []bool) {
	var on, off []float64
	for i, v := range lat {
		if same[i] {
			on = append(on, v)
		} else {
			off = append(off, v)
		}
	}
	sort.Float64s(on)
	sort.Float64s(off)
	line := fmt.Sprintf("go peer: woken on the waker's CPU in %d of %d wake-ups", len(on), len(lat))
	if len(on) > 0 {
		line += fmt.Sprintf(", p50 %.1f us", percentile(on, 50))
	}
	if len(off) > 0 {
		line += fmt.Sprintf("; on another CPU p50 %.1f us, p99 %.1f us", percentile(off, 50), percentile(off, 99))
	}
	fmt.Fprintln(os.Stderr, line)
}

// The echo server: one listener, a goroutine per connection echoing what it reads.
func echoServer() {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		fail(err.Error())
	}
	fmt.Printf("PORT %d\n", ln.Addr().(*net.TCPAddr).Port)
	os.Stdout.Sync()
	for {
		c, err := ln.Accept()
		if err != nil {
			continue
		}
		go func(c net.Conn) {
			defer c.Close()
			buf := make([]byte, 4096)
			for {
				k, err := c.Read(buf)
				if k > 0 {
					if _, werr := c.Write(buf[:k]); werr != nil {
						return
					}
				}
				if err != nil { // io.EOF: the client closed
					return
				}
			}
		}(c)
	}
}

// The process's resident memory now, in bytes (/proc/self/statm).
func rssBytes() int64 {
	b, err := os.ReadFile("/proc/self/statm")
	if err != nil {
		return 0
	}
	var pages, resident int64
	fmt.Sscan(string(b), &pages, &resident)
	return resident * int64(os.Getpagesize())
}

// n goroutines parked on one channel, as a server parks one per idle
// connection: the time to start them all (each counts itself parked just
// before it waits), the resident memory each adds, and the time for all of
// them to finish once the channel is closed.
func park(n int64, _ float64) []figure {
	var parked atomic.Int64
	var done sync.WaitGroup
	gate := make(chan struct{})
	runtime.GC()
	rss0 := rssBytes()
	t0 := time.Now()
	done.Add(int(n))
	for i := int64(0); i < n; i++ {
		go func() {
			parked.Add(1)
			<-gate
			done.Done()
		}()
	}
	for parked.Load() < n {
		runtime.Gosched()
	}
	start := time.Since(t0)
	rss1 := rssBytes()
	t1 := time.Now()
	close(gate)
	done.Wait()
	drain := time.Since(t1)
	per := float64(n)
	return []figure{{"start", "ns/fiber", float64(start.Nanoseconds()) / per},
		{"rss", "bytes/fiber", float64(rss1-rss0) / per},
		{"drain", "ns/fiber", float64(drain.Nanoseconds()) / per}}
}

func fail(msg string) {
	fmt.Fprintln(os.Stderr, "go peer:", msg)
	os.Exit(1)
}

func main() {
	workloads := map[string]func(int64, float64) []figure{
		// Go's spawn_many already waits on a WaitGroup, so spawn_many_wg is the same.
		"yield": yieldPingPong, "spawn_join": spawnJoin, "spawn_many": spawnMany, "spawn_many_wg": spawnMany,
		"skynet": skynetWorkload, "channel": channelRoundTrip, "channel_1w": channelRoundTrip1w,
		"channel_any": channelRoundTripAny, "wake": wakeLatency, "wake_any": wakeLatencyAny,
		"wake_run_on": wakeRunOn, "pipeline": pipeline, "park": park,
	}
	const usage = "usage: go-peer WORKLOAD|echo-server [-n N] [-gap-us G] [-no-warmup] [-unpinned] [-cpu-split]"
	if len(os.Args) < 2 {
		fail(usage)
	}
	name := os.Args[1]
	if name == "--help" || name == "-h" || name == "-help" {
		fmt.Println(usage + "\nThe Go peer of bench/peers/peers.py: runs one workload and prints JSON lines.")
		return
	}
	fs := flag.NewFlagSet(name, flag.ExitOnError)
	n := fs.Int64("n", 100000, "size of the trial")
	gap := fs.Float64("gap-us", 300, "wake: microseconds the waker pauses before each wake")
	noWarmup := fs.Bool("no-warmup", false, "skip the warm-up at a tenth of the size")
	fs.BoolVar(&cpuSplit, "cpu-split", false, "wake*: report on stderr how many wake-ups ran on the waker's CPU, and the p50 of each kind")
	fs.BoolVar(&unpinned, "unpinned", false, "wake, channel: lock the goroutines to OS threads but leave the threads on any CPU")
	fs.Parse(os.Args[2:])
	if !(*gap >= 0 && *gap <= 1e6) { // NaN fails both
		fail("-gap-us must be a number of microseconds from 0 to 1000000")
	}
	runtime.GOMAXPROCS(runtime.NumCPU())
	if name == "echo-server" {
		echoServer()
		return
	}
	run, ok := workloads[name]
	if !ok || *n <= 0 {
		fail("unknown workload or bad -n: " + name)
	}
	if !*noWarmup {
		warm := *n / 10
		if warm < 1 {
			warm = 1
		}
		warmingUp = true
		run(warm, *gap)
		warmingUp = false
	}
	for _, f := range run(*n, *gap) {
		fmt.Printf("{\"peer\": \"go\", \"workload\": \"%s\", \"metric\": \"%s\", \"unit\": \"%s\", \"value\": %g}\n",
			name, f.metric, f.unit, f.value)
	}
}
