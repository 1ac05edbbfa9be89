// echo: what the P2PFaaS Go original needs around it in the benches. POST|GET /function/<name>
// answers the body it got (an OpenFaaS gateway with an echo function behind it: also "a bare Go
// echo", the floor of an HTTP round trip on this machine); GET /configuration and /list answer as
// a discovery service with no peers (the scheduler waits for its discovery's configuration before
// it serves). With -delay, /function/ answers after that long: a function of that duration behind
// a bare Go server (bench/knative_rule.py's floor). Standard library only.
//
//	go build -o echo bench/loadgen/echo/main.go && echo -listen 127.0.0.1:8080 [-delay 100ms]
package main

import (
	"flag"
	"io"
	"log"
	"net/http"
	"time"
)

func main() {
	listen := flag.String("listen", "127.0.0.1:8080", "address to listen on")
	delay := flag.Duration("delay", 0, "how long /function/ takes before it answers")
	flag.Parse()
	http.HandleFunc("/function/", func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(r.Body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		if *delay > 0 {
			time.Sleep(*delay)
		}
		w.Header().Set("Content-Type", "application/octet-stream")
		_, _ = w.Write(body)
	})
	http.HandleFunc("/configuration", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"machine_ip": "127.0.0.1", "machine_id": "n1", "machine_fog_net_id": "default", "init_servers": []}`)
	})
	http.HandleFunc("/list", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, "[]")
	})
	log.Fatal(http.ListenAndServe(*listen, nil))
}
