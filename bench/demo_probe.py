"""How steady `python -m lab demo`'s probe of the machine is (lab.runs.pipeline.probe), run by hand.

Reads the probe in `--runs` fresh processes, each as the demo does (one call after importing torch), and prints
each reading with the 1-minute load average, then the spread. The expected time scales with the reading, so its
spread is the expectation's spread from the probe alone. Usage: `python bench/demo_probe.py --runs 10`.
"""

import argparse
import os
import statistics
import subprocess
import sys

READ = "from lab.runs.pipeline import probe; print(probe())"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=10)
    args = p.parse_args()
    readings = []
    for i in range(args.runs):
        out = subprocess.run([sys.executable, "-c", READ], capture_output=True, text=True, check=True).stdout
        readings.append(float(out))
        print(f"run {i + 1}: {1e3 * readings[-1]:.3f} ms (load average {os.getloadavg()[0]:.1f} "
              f"on {os.cpu_count()} cores)", flush=True)
    lo, mid, hi = min(readings), statistics.median(readings), max(readings)
    print(f"probe over {args.runs} processes: min {1e3 * lo:.3f} ms, median {1e3 * mid:.3f} ms, max {1e3 * hi:.3f} ms "
          f"(max / min {hi / lo:.2f})")


if __name__ == "__main__":
    main()
