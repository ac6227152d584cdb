"""A PNG of a pipeline run's report (`docs/demo_report.png`: the README, the main job's guide).

Opens RUN_DIR/report/report.html in headless Chromium (the system's `chromium`, driven by
playwright; no browser is downloaded), saves a screenshot of the top of the page (the whole
page with `--full-page`) and prints the PNG's path. Exits non-zero, listing them, if the page
logged console errors.

    .venv/bin/python scripts/report_screenshot.py runs/demo --out docs/demo_report.png
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run_dir", type=Path, help="a pipeline run folder")
    parser.add_argument("--out", type=Path, default=Path("docs/demo_report.png"))
    parser.add_argument("--width", type=int, default=1100)
    parser.add_argument("--height", type=int, default=1400)
    parser.add_argument("--full-page", action="store_true", help="the whole page, not its top")
    args = parser.parse_args()

    page_path = args.run_dir / "report" / "report.html"
    if not page_path.is_file():
        print(f"error: no report at {page_path} (run the pipeline's report stage)", file=sys.stderr)
        return 1
    chromium = shutil.which("chromium")
    if chromium is None:
        print("error: no `chromium` on PATH (Debian: apt-get install chromium)", file=sys.stderr)
        return 1
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        print("error: playwright is not installed (pip install -e '.[test]')", file=sys.stderr)
        return 1

    errors: list[str] = []
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
        try:
            page = browser.new_page(viewport={"width": args.width, "height": args.height})
            page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
            page.on("pageerror", lambda e: errors.append(str(e)))
            page.goto(page_path.resolve().as_uri())
            page.wait_for_load_state("load")
            page.screenshot(path=str(args.out), full_page=args.full_page)
        finally:
            browser.close()
    print(args.out)
    for error in errors:
        print(f"console error: {error}", file=sys.stderr)
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
