#!/usr/bin/env python3
"""Adds up meson's testlog.json files (GoogleTest cases counted one by one) into one closing line."""
import json
import re
import sys

passed = failed = skipped = 0
for path in sys.argv[1:]:
    try:
        lines = open(path, encoding="utf-8").read().splitlines()
    except OSError as exc:
        print(f"test-summary: cannot read {path}: {exc}", file=sys.stderr)
        failed += 1
        continue
    for line in lines:
        entry = json.loads(line)
        result = entry.get("result", "")
        # Colour codes (gtest colours its output when asked to) would split "] N tests".
        out = re.sub(r"\x1b\[[0-9;]*m", "", entry.get("stdout", "") or "")
        # gtest prints "[  PASSED  ] N tests." / "[  FAILED  ] N tests," / "[  SKIPPED ] N tests,"
        gp = re.search(r"\[  PASSED  \] (\d+) test", out)
        gf = re.search(r"\[  FAILED  \] (\d+) test", out)
        gs = re.search(r"\[  SKIPPED \] (\d+) test", out)
        if gp or gf:
            passed += int(gp.group(1)) if gp else 0
            failed += int(gf.group(1)) if gf else 0
            skipped += int(gs.group(1)) if gs else 0
            if result not in ("OK", "SKIP", "EXPECTEDFAIL") and not gf:
                failed += 1
        elif result == "OK":
            passed += 1
        elif result == "SKIP":
            skipped += 1
        else:
            failed += 1
print(f"{passed} passed, {failed} failed, {skipped} skipped")
sys.exit(1 if failed else 0)
