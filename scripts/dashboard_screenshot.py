"""Screenshot of the live dashboard of a running ``p2pfaas up`` (how docs/img/dashboard.png is made).

    p2pfaas up &                                   # the stack (reads/writes ./data)
    p2pfaas farm run --scenario bursty --speed 2 & # load
    python scripts/dashboard_screenshot.py --wait 90 --out docs/img/dashboard.png

Opens ``/ui`` of the first node in headless Chromium (Debian's ``chromium``) and writes a
palette PNG. A bridge that does not serve ``/ui`` yet gets a dashboard served from here.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import io
import sys
import tempfile
import time
from pathlib import Path

from PIL import Image

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "_support"))   # the small DevTools client the browser test uses

from browser import Chromium  # noqa: E402

from p2pfaas.stack_settings import read_endpoints  # noqa: E402


@contextlib.asynccontextmanager
async def dashboard_url(endpoints: dict):
    """The dashboard of the stack's first node (every HTTP bridge serves /ui)."""
    _, http = next(iter(endpoints["http"].items()))
    yield f"{http}/ui"


def small_png(png: bytes, colors: int = 128) -> bytes:
    """A palette PNG: dashboards are flat colours, so this is a fraction of the size and looks the same."""
    image = Image.open(io.BytesIO(png)).convert("RGB").quantize(colors=colors, method=Image.Quantize.MEDIANCUT)
    out = io.BytesIO()
    image.save(out, format="PNG", optimize=True)
    return out.getvalue()


async def main(args: argparse.Namespace) -> None:
    endpoints = read_endpoints(args.data_dir)
    if not endpoints:
        sys.exit(f"no running stack: {args.data_dir}/endpoints.json not found (start p2pfaas up first)")
    async with dashboard_url(endpoints) as url, Chromium(args.profile, width=args.width, height=900) as page:
        await page.open(url)
        await page.wait_for("document.querySelector('[data-pool] [data-field=workers_ready]')?.dataset.value", 60)
        started = time.monotonic()
        while (left := args.wait - (time.monotonic() - started)) > 0:
            print(f"\rwaiting {left:4.0f} s for the dashboard to fill ...", end="", file=sys.stderr, flush=True)
            await asyncio.sleep(min(1.0, left))
        print(file=sys.stderr)
        shot = await page.screenshot(args.profile / "full.png")
        if page.errors:
            print("page errors:", *page.errors, sep="\n  ", file=sys.stderr)
    args.out.write_bytes(small_png(shot.read_bytes()))
    print(f"{args.out}: {args.out.stat().st_size // 1024} KB")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", type=Path, default=Path("data"), help="the data dir of the running p2pfaas up")
    parser.add_argument("--wait", type=float, default=60.0, help="seconds to let the charts fill before the shot")
    parser.add_argument("--width", type=int, default=1440)
    parser.add_argument("--out", type=Path, default=Path("docs/img/dashboard.png"))
    arguments = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="p2pfaas-chromium-") as profile:   # a fresh browser profile
        arguments.profile = Path(profile)
        asyncio.run(main(arguments))
