package metric

import (
	"bytes"
	"os"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// writeRuntime writes the Go runtime's and the process's metrics, read when scraped:
// the most used of those Prometheus's client wrote, under its names. The process's come from Linux's
// /proc and are left out where it is missing.
func (r *Registry) writeRuntime(b *bytes.Buffer) {
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	gauge := func(name, help string, v float64) {
		b.WriteString("# HELP " + name + " " + help + "\n# TYPE " + name + " gauge\n")
		sample(b, name, "", v)
	}
	counter := func(name, help string, v float64) {
		b.WriteString("# HELP " + name + " " + help + "\n# TYPE " + name + " counter\n")
		sample(b, name, "", v)
	}
	gauge("go_goroutines", "Number of goroutines that currently exist.", float64(runtime.NumGoroutine()))
	b.WriteString("# HELP go_info Information about the Go environment.\n# TYPE go_info gauge\n")
	sample(b, "go_info", `version="`+escaper.Replace(runtime.Version())+`"`, 1)
	gauge("go_memstats_alloc_bytes", "Number of bytes allocated in heap and currently in use.", float64(ms.HeapAlloc))
	counter("go_memstats_alloc_bytes_total", "Total number of bytes allocated in heap until now, even if released already.", float64(ms.TotalAlloc))
	gauge("go_memstats_heap_inuse_bytes", "Number of heap bytes that are in use.", float64(ms.HeapInuse))
	gauge("go_memstats_heap_objects", "Number of currently allocated objects.", float64(ms.HeapObjects))
	gauge("go_memstats_sys_bytes", "Number of bytes obtained from system.", float64(ms.Sys))
	gauge("go_memstats_last_gc_time_seconds", "Number of seconds since 1970 of last garbage collection.", float64(ms.LastGC)/1e9)
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) == nil {
		cpu := time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
		counter("process_cpu_seconds_total", "Total user and system CPU time spent in seconds.", cpu.Seconds())
	}
	if statm, err := os.ReadFile("/proc/self/statm"); err == nil {
		if f := strings.Fields(string(statm)); len(f) >= 2 {
			page := float64(os.Getpagesize())
			vsz, _ := strconv.ParseFloat(f[0], 64)
			rss, _ := strconv.ParseFloat(f[1], 64)
			gauge("process_resident_memory_bytes", "Resident memory size in bytes.", rss*page)
			gauge("process_virtual_memory_bytes", "Virtual memory size in bytes.", vsz*page)
		}
	}
	if fds, err := os.ReadDir("/proc/self/fd"); err == nil {
		gauge("process_open_fds", "Number of open file descriptors.", float64(len(fds)))
	}
	var lim syscall.Rlimit
	if syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim) == nil {
		gauge("process_max_fds", "Maximum number of open file descriptors.", float64(lim.Cur))
	}
	gauge("process_start_time_seconds", "Start time of the process since unix epoch in seconds.",
		float64(r.start.UnixNano())/1e9)
}
