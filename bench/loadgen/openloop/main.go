// openloop: an open-loop HTTP load generator at a constant rate (as vegeta, which Knative's
// data-plane rule is measured with). Request i starts at start + i/rate whatever the answers
// do, so a slow server meets more requests at once, never fewer; a request's latency runs
// from the moment it was due, not from when it could be sent (no coordinated omission).
//
//	go build -o openloop bench/loadgen/openloop/main.go
//	openloop -url http://127.0.0.1:18080/function/sleep -body 0.1 -rate 1000 -duration 40s
//
// It prints one JSON object: requests due and sent, status codes, errors, the latency
// percentiles in seconds, and the rate it kept. Standard library only.
package main

import (
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"sort"
	"sync"
	"time"
)

type result struct {
	Due        int            `json:"due"`
	Sent       int            `json:"sent"`
	Codes      map[string]int `json:"codes"`
	Errors     map[string]int `json:"errors"`
	P50        float64        `json:"p50_s"`
	P90        float64        `json:"p90_s"`
	P95        float64        `json:"p95_s"`
	P99        float64        `json:"p99_s"`
	Max        float64        `json:"max_s"`
	Mean       float64        `json:"mean_s"`
	Rate       float64        `json:"rate"`
	LateStarts int            `json:"late_starts"` // requests sent more than 1 ms after they were due
	Seconds    float64        `json:"seconds"`
}

func quantile(sorted []float64, q float64) float64 {
	if len(sorted) == 0 {
		return 0
	}
	i := int(q*float64(len(sorted))+0.5) - 1
	if i < 0 {
		i = 0
	}
	if i >= len(sorted) {
		i = len(sorted) - 1
	}
	return sorted[i]
}

func main() {
	url := flag.String("url", "", "the URL to POST to")
	body := flag.String("body", "", "the request body")
	rate := flag.Float64("rate", 1000, "requests per second")
	duration := flag.Duration("duration", 40*time.Second, "how long to send")
	timeout := flag.Duration("timeout", 30*time.Second, "a request's timeout")
	flag.Parse()
	if *url == "" || *rate <= 0 {
		fmt.Fprintln(os.Stderr, "openloop: -url and a positive -rate are needed")
		os.Exit(2)
	}
	client := &http.Client{Timeout: *timeout, Transport: &http.Transport{
		MaxIdleConns: 10000, MaxIdleConnsPerHost: 10000, DisableCompression: true, IdleConnTimeout: time.Minute,
	}}
	payload := []byte(*body)
	due := int(float64(*duration/time.Second) * *rate)
	interval := time.Duration(float64(time.Second) / *rate)
	latencies := make([]float64, due)
	statuses := make([]int, due)
	failures := make([]string, due)
	var wg sync.WaitGroup
	late := 0
	start := time.Now()
	for i := 0; i < due; i++ {
		at := start.Add(time.Duration(i) * interval)
		if wait := time.Until(at); wait > 0 {
			time.Sleep(wait)
		} else if wait < -time.Millisecond {
			late++
		}
		wg.Add(1)
		go func(i int, at time.Time) {
			defer wg.Done()
			response, err := client.Post(*url, "application/octet-stream", bytes.NewReader(payload))
			if err == nil {
				_, err = io.Copy(io.Discard, response.Body)
				response.Body.Close()
				statuses[i] = response.StatusCode
			}
			latencies[i] = time.Since(at).Seconds()
			if err != nil {
				failures[i] = err.Error()
			}
		}(i, at)
	}
	wg.Wait()
	elapsed := time.Since(start).Seconds()
	out := result{Due: due, Sent: due, Codes: map[string]int{}, Errors: map[string]int{}, LateStarts: late,
		Seconds: elapsed, Rate: float64(due) / float64(*duration/time.Second)}
	ok := make([]float64, 0, due)
	sum := 0.0
	for i := 0; i < due; i++ {
		if failures[i] != "" {
			msg := failures[i]
			if len(msg) > 120 {
				msg = msg[:120]
			}
			out.Errors[msg]++
			continue
		}
		out.Codes[fmt.Sprint(statuses[i])]++
		ok = append(ok, latencies[i])
		sum += latencies[i]
	}
	sort.Float64s(ok)
	if len(ok) > 0 {
		out.P50, out.P90, out.P95, out.P99 = quantile(ok, 0.50), quantile(ok, 0.90), quantile(ok, 0.95), quantile(ok, 0.99)
		out.Max, out.Mean = ok[len(ok)-1], sum/float64(len(ok))
	}
	encoded, _ := json.Marshal(out)
	fmt.Println(string(encoded))
}
