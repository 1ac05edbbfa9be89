"""Fault suite: ``p2pfaas up`` under a steady open-loop load over HTTP, NATS and MQTT (both MQTT
modes) while, one at a time, a worker, the node, ``up`` itself, nats-server, Mosquitto and the
MQTT bridge are killed with SIGKILL and the disk under JetStream is filled (on a small tmpfs).

Transports (rows): HTTP direct (``POST /function/sleep``), HTTP async (``/async-function`` +
``/result/{id}``), NATS direct (``FaasClient.invoke``), NATS async (``FaasClient.submit``, answers
on the client's result/reject subjects), MQTT QoS 1 through nats-server's own listener
(``up --mqtt nats``) and through Mosquitto + the MQTT bridge (``up --mqtt mosquitto``): a device
publishes ``faas/n1/request/sleep/<client>/<req>`` and subscribes ``faas/result/<client>/#`` and
``faas/reject/<client>/#`` with a persistent session.

Columns:
  sent       calls made (load under the fault + the short load after recovery)
  accepted   direct: any answer from the system (a fast 503/500 because the node or worker died
             mid-call is an honest answer); async: 202 / PUBACK / JetStream PubAck
  answered   a final answer received (result or rejection); NATS async may fetch a missed one
             from the results stream at the end (said in the reasons)
  errors     answered, but not with status 200 (reasons list them)
  refused    not accepted and the caller was told at once (connection refused, 503 not stored,
             publish error): refused is not lost
  lost       accepted async calls with no answer by the end of the drain bound (after the fault
             ended and the stack recovered); direct calls silent until their timeout; async calls
             that got neither an acknowledgement, nor an error, nor an answer
  dup        request ids with more than one *different* answer, or more than one answer kept in
             the results stream ("-" on direct calls: no dedup there). The same answer received
             twice is an MQTT QoS 1 redelivery, reported but not a duplicate.
  after ok   calls made after recovery that got status 200

A fault PASSes when every row has lost 0 and dup 0, every call after recovery succeeded and
/healthz says 200 at the end. Work dirs (logs, nats-server's log) are kept under --work-dir.

  .venv/bin/python bench/faults.py                      # every fault, each on a fresh stack per mode
  .venv/bin/python bench/faults.py --quick              # short phases, one stack per mode
  .venv/bin/python bench/faults.py --faults worker,node --seed 3 --json out.json
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import orjson  # noqa: E402

from fault_suite import Options, all_faults, plan, print_reports, run_session  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    names = list(all_faults())
    parser.add_argument("--faults", default=",".join(names), help=f"comma-separated subset of: {', '.join(names)}")
    parser.add_argument("--quick", action="store_true", help="short phases and one stack per mode (~7 min)")
    parser.add_argument("--seed", type=int, default=1, help="seeds the arrivals, payloads and the worker to kill")
    parser.add_argument("--rate", type=float, help="calls per second per transport (default 4: with 5 transports, ~55 %% of the node's K=4 slots)")
    parser.add_argument("--load-s", type=float, help="seconds of load under each fault (default 24, quick 6)")
    parser.add_argument("--disk-size", default="64m", help="size of the tmpfs of the disk-full fault")
    parser.add_argument("--share-stack", action="store_true", help="run the faults of a mode on one stack (--quick does)")
    parser.add_argument("--work-dir", type=Path, help="where stacks keep their data and logs (default: a new temp dir)")
    parser.add_argument("--json", type=Path, help="write every report (rows, events, misses) here")
    args = parser.parse_args()
    chosen = [n.strip() for n in args.faults.split(",") if n.strip()]
    unknown = [n for n in chosen if n not in names]
    if unknown:
        parser.error(f"unknown fault(s) {unknown}; choose from {names}")
    work_dir = args.work_dir or Path(tempfile.mkdtemp(prefix="p2pfaas-faults-"))
    overrides = {k: v for k, v in (("rate", args.rate), ("load_s", args.load_s)) if v is not None}
    opts = (Options.quick if args.quick else Options)(seed=args.seed, disk_size=args.disk_size, work_dir=work_dir,
                                                      **overrides)
    if os.geteuid() != 0 and "disk-full" in chosen:
        print("note: disk-full needs root to mount its tmpfs; it will be reported as skipped", file=sys.stderr)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("broker.connection").setLevel(logging.ERROR)   # our clients reconnecting: expected
    started = time.monotonic()

    def say(text: str) -> None:
        print(f"{time.monotonic() - started:7.1f} s  {text}", flush=True)

    async def run_all():
        reports = []
        for mode, faults in plan(chosen, share_stack=args.quick or args.share_stack):
            reports += await run_session(mode, faults, opts, say)
        return reports

    reports = asyncio.run(run_all())
    ok = print_reports(reports)
    print(f"work dir: {work_dir}; {time.monotonic() - started:.0f} s in all")
    if args.json:
        args.json.write_bytes(orjson.dumps({"options": {k: str(v) for k, v in vars(opts).items()},
                                            "reports": [r.as_json() for r in reports]}, option=orjson.OPT_INDENT_2))
    if ok and args.work_dir is None:
        shutil.rmtree(work_dir, ignore_errors=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
