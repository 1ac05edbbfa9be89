"""Instruments of bench/invoke_path.py: CPU time per process (/proc), the HTTP load generators
(wrk, hey), py-spy profiles and a count of the messages nats-server carries."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import resource
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

CLK_TCK = os.sysconf("SC_CLK_TCK")


# ---------------------------------------------------------------------------------------------
# CPU time
# ---------------------------------------------------------------------------------------------
def cpu_seconds(pid: int) -> float:
    """utime + stime of a live process (0 when it is gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def machine_cpu() -> tuple[float, float]:
    """(busy, total) CPU seconds of the whole machine since boot, all cores."""
    ticks = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]]
    total = sum(ticks)
    return (total - ticks[3] - ticks[4]) / CLK_TCK, total / CLK_TCK


def reaped_children_cpu() -> float:
    """CPU seconds of this process's children that ended (wrk, hey): counted once reaped."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


@dataclass(frozen=True)
class CpuSample:
    by_group: dict[str, float]
    tools: float
    machine_busy: float
    machine_total: float


class CpuMeter:
    """CPU seconds of named groups of processes; ``usage(a, b, n)`` turns two samples into µs per
    request, plus the load-generator tool, the CPU of everything else on the machine and how busy
    the machine was."""

    def __init__(self, groups: dict[str, list[int]]) -> None:
        self.groups = groups

    def sample(self) -> CpuSample:
        busy, total = machine_cpu()
        return CpuSample({name: sum(cpu_seconds(p) for p in pids) for name, pids in self.groups.items()},
                         reaped_children_cpu(), busy, total)

    @staticmethod
    def usage(a: CpuSample, b: CpuSample, requests: float) -> dict:
        n = max(1.0, requests)
        used = {name: b.by_group[name] - a.by_group.get(name, 0.0) for name in b.by_group}
        tools = b.tools - a.tools
        busy = b.machine_busy - a.machine_busy
        ours = sum(used.values()) + tools
        out = {name: s / n * 1e6 for name, s in used.items()}
        out["http tool"] = tools / n * 1e6
        out["others"] = max(0.0, busy - ours) / n * 1e6
        out["machine_busy"] = busy / max(1e-9, b.machine_total - a.machine_total)
        return out


def load_average() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


# ---------------------------------------------------------------------------------------------
# HTTP load generators: the same one for both sides of every HTTP comparison
# ---------------------------------------------------------------------------------------------
WRK_LUA = r"""
wrk.method = "POST"
wrk.body = os.getenv("BENCH_BODY") or "hello"
wrk.headers["Content-Type"] = "application/octet-stream"
done = function(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    "WRKJSON {\"requests\": %d, \"duration_us\": %d, \"p50_us\": %.1f, \"p99_us\": %.1f, " ..
    "\"connect\": %d, \"read\": %d, \"write\": %d, \"status\": %d, \"timeout\": %d}\n",
    summary.requests, summary.duration, latency:percentile(50), latency:percentile(99),
    e.connect, e.read, e.write, e.status, e.timeout))
end
"""


class HttpLoad:
    """``wrk -t1`` (a Lua POST script) or ``hey -m POST``: N connections for a while, POST the body."""

    def __init__(self, tool: str, workdir: Path, body: str, path: str) -> None:
        self.tool, self.body, self.path = tool, body, path
        self.binary = shutil.which(tool)
        if self.binary is None:
            raise FileNotFoundError(f"{tool} not found: apt-get install -y {tool}")
        self.lua = workdir / "post.lua"
        self.lua.write_text(WRK_LUA)

    def command(self, port: int, conns: int, duration_s: float) -> list[str]:
        url = f"http://127.0.0.1:{port}{self.path}"
        if self.tool == "wrk":
            return [self.binary, "-t1", f"-c{conns}", f"-d{max(1, round(duration_s))}s", "--timeout", "10s",
                    "-s", str(self.lua), url]
        return [self.binary, "-z", f"{duration_s:g}s", "-c", str(conns), "-m", "POST", "-d", self.body,
                "-T", "application/octet-stream", url]

    async def run(self, port: int, conns: int, duration_s: float) -> dict:
        from parties import die_with_parent

        proc = await asyncio.create_subprocess_exec(
            *self.command(port, conns, duration_s), stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
            stdin=asyncio.subprocess.DEVNULL, env=dict(os.environ, BENCH_BODY=self.body), preexec_fn=die_with_parent)
        try:
            out, _ = await asyncio.wait_for(proc.communicate(), duration_s + 30)
        except asyncio.TimeoutError:
            proc.kill()
            await proc.wait()
            raise
        text = out.decode(errors="replace")
        result = parse_wrk(text) if self.tool == "wrk" else parse_hey(text)
        result["conns"] = conns
        return result


def parse_wrk(text: str) -> dict:
    for line in text.splitlines():
        if line.startswith("WRKJSON "):
            r = json.loads(line[8:])
            errors = r["connect"] + r["read"] + r["write"] + r["status"] + r["timeout"]
            ok = r["requests"] - r["status"]
            return {"rps": ok / (r["duration_us"] / 1e6), "p50_us": r["p50_us"], "p99_us": r["p99_us"],
                    "requests": r["requests"], "errors": errors}
    raise RuntimeError(f"wrk printed no result:\n{text[-2000:]}")


def parse_hey(text: str) -> dict:
    """hey's summary: total seconds, latency distribution (0.1 ms resolution), status codes."""
    total = re.search(r"Total:\s+([\d.]+) secs", text)
    if total is None:
        raise RuntimeError(f"hey printed no summary:\n{text[-2000:]}")
    quantiles = {int(q): float(s) * 1e6 for q, s in re.findall(r"(\d+)%+ in ([\d.]+) secs", text)}
    statuses = {int(code): int(n) for code, n in re.findall(r"\[(\d{3})\]\s+(\d+) responses", text)}
    error_part = text.split("Error distribution:", 1)[1] if "Error distribution:" in text else ""
    errors = sum(int(n) for n in re.findall(r"\[(\d+)\]", error_part))
    ok = statuses.get(200, 0)
    return {"rps": ok / float(total.group(1)), "p50_us": quantiles.get(50, float("nan")),
            "p99_us": quantiles.get(99, float("nan")), "requests": sum(statuses.values()),
            "errors": errors + sum(n for code, n in statuses.items() if code != 200)}


# ---------------------------------------------------------------------------------------------
# profiles
# ---------------------------------------------------------------------------------------------
def py_spy() -> str | None:
    beside = Path(sys.executable).parent / "py-spy"
    return str(beside) if beside.exists() else shutil.which("py-spy")


async def record_profiles(targets: dict[str, list[int]], out_dir: Path, label: str, duration_s: float) -> dict[str, list[Path]]:
    """py-spy of every pid (``--native``: C frames included, idle waits left out), in the background;
    returns once every recorder finished. (``--gil`` was tried and misleads here: it blames the time
    another thread holds the GIL on whatever frame waits for it, e.g. ``StreamWriter.writelines``.)"""
    from parties import die_with_parent

    binary = py_spy()
    if binary is None:
        raise FileNotFoundError("py-spy not found: .venv/bin/pip install py-spy")
    out_dir.mkdir(parents=True, exist_ok=True)
    spies, files = [], {}
    for kind, pids in targets.items():
        for pid in pids:
            out = out_dir / f"{label}-{kind.replace(' ', '_')}-{pid}.collapsed"
            files.setdefault(kind, []).append(out)
            spies.append(await asyncio.create_subprocess_exec(
                binary, "record", "--pid", str(pid), "--native", "--rate", "200", "--format", "raw",
                "-o", str(out), "-d", str(max(1, round(duration_s))), stdout=asyncio.subprocess.DEVNULL,
                stderr=asyncio.subprocess.DEVNULL, preexec_fn=die_with_parent))
    for spy in spies:
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(spy.wait(), duration_s + 30)
        if spy.returncode is None:
            spy.kill()
            await spy.wait()
    return {kind: [f for f in fs if f.exists()] for kind, fs in files.items()}


def summarize_collapsed(paths: list[Path], top: int = 12) -> dict:
    """Self and inclusive shares of the samples in ``paths`` (frames present in nearly every sample,
    such as the event loop's, are left out of the inclusive list)."""
    total = 0
    own: dict[str, int] = {}
    incl: dict[str, int] = {}
    for path in paths:
        for line in path.read_text(errors="replace").splitlines():
            stack, _, count = line.rpartition(" ")
            if not stack or not count.isdigit():
                continue
            n = int(count)
            frames = [re.sub(r":\d+\)$", ")", f) for f in stack.split(";") if not f.startswith(("process ", "thread "))]
            if not frames:
                continue
            total += n
            own[frames[-1]] = own.get(frames[-1], 0) + n
            for frame in set(frames):
                incl[frame] = incl.get(frame, 0) + n
    t = max(1, total)
    return {"samples": total,
            "self_top": [(f, round(100 * c / t, 1)) for f, c in sorted(own.items(), key=lambda x: -x[1])[:top]],
            "incl_top": [(f, round(100 * c / t, 1)) for f, c in sorted(incl.items(), key=lambda x: -x[1])
                         if c / t < 0.9][:top]}


async def count_messages(url: str, prefix: str, duration_s: float) -> dict[str, int]:
    """Messages nats-server carries, by kind, as a ``>`` subscriber sees them (a raw request/reply is 2)."""
    import nats

    p = re.escape(prefix)
    kinds = [
        ("replies (answers, worker outcomes, publish acks)", re.compile(r"^_INBOX\.")),
        ("JetStream acks", re.compile(r"^\$JS\.ACK\.")),
        ("pull requests", re.compile(r"^\$JS\.API\.CONSUMER\.MSG\.NEXT\.")),
        ("other JetStream API", re.compile(r"^\$JS\.")),
        ("direct requests", re.compile(rf"^{p}\.[^.]+\.(request|forward)\.")),
        ("worker calls", re.compile(rf"^{p}\.[^.]+\.worker\.")),
        ("async tasks", re.compile(rf"^{p}\.async\.")),
        ("results/rejections", re.compile(rf"^{p}\.(result|reject)\.")),
        ("telemetry", re.compile(rf"^{p}\.[^.]+\.(telemetry|membership)")),
    ]
    counts: dict[str, int] = {}
    nc = await nats.connect(url, name="bench-counter", pending_size=256 * 1024 * 1024)

    async def tally(msg) -> None:
        for name, rx in kinds:
            if rx.match(msg.subject):
                counts[name] = counts.get(name, 0) + 1
                return
        counts["other"] = counts.get("other", 0) + 1

    await nc.subscribe(">", cb=tally)
    await asyncio.sleep(duration_s)
    await nc.close()
    return counts
