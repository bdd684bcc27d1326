#!/usr/bin/env python3
"""Builds the workspace's test binaries with cargo and runs them, several at once.

    python3 scripts/run_tests.py [--jobs N] [--alone NAMES] [--first NAMES]
                                 [--timeout SECS] -- CARGO_TEST_ARGS...

`cargo test` runs one test binary at a time. Most of ours spend their time
waiting (on leases, TTLs, child processes), so on two cores two of them at once
halve the wall time. Some must not share the machine: those that SIGSTOP the
shared moto servers (every other S3 user would stall) and those whose timing
windows a busy CPU could push past. They are named by --alone and run one by
one after the rest.

Each binary runs as `cargo test` would run it (in its package's directory,
with CARGO_MANIFEST_DIR set); its output is printed whole when it ends, under
cargo's own `Running` header, so the `test result:` lines read as before. A
binary still running after --timeout seconds is killed with its process group
and counted as failed. Exits 1 if the build or any binary failed.
"""

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor


class Binary:
    """One test executable cargo built, and where and how it ran."""

    def __init__(self, name, kind, src, package_dir, executable):
        self.name = name
        self.kind = kind
        self.src = src
        self.package_dir = package_dir
        self.executable = executable
        self.seconds = None
        self.outcome = None

    def label(self):
        rel = os.path.relpath(self.src, self.package_dir)
        if self.kind in ("lib", "bin", "proc-macro"):
            return f"unittests {rel}"
        return rel


def build(cargo_args):
    """Runs `cargo test --no-run` and returns the binaries it would run."""
    cmd = ["cargo", "test", *cargo_args, "--no-run", "--message-format=json-render-diagnostics"]
    print("[tests] " + " ".join(cmd), flush=True)
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, text=True)
    binaries = []
    for line in proc.stdout.splitlines():
        try:
            msg = json.loads(line)
        except json.JSONDecodeError:
            continue
        if msg.get("reason") != "compiler-artifact" or not msg.get("executable"):
            continue
        if not msg["profile"]["test"]:
            continue  # built for the tests' sake (a bin, an example), not run
        target = msg["target"]
        binaries.append(Binary(
            name=target["name"],
            kind=target["kind"][0],
            src=target["src_path"],
            package_dir=os.path.dirname(msg["manifest_path"]),
            executable=msg["executable"],
        ))
    return proc.returncode == 0, binaries


class Runner:
    """Runs binaries, prints their output whole, and kills them all on an interrupt."""

    def __init__(self, timeout):
        self.timeout = timeout
        self.lock = threading.Lock()
        self.started_at = time.monotonic()
        self.running = set()
        self.stopping = False

    def stamp(self):
        """Seconds since the tests started, for the progress lines."""
        return f"{time.monotonic() - self.started_at:6.1f} s"

    def say(self, text):
        with self.lock:
            print(text, flush=True)

    def run(self, binary):
        """Runs one binary to its end (or the timeout) and prints its output whole."""
        env = dict(os.environ, CARGO_MANIFEST_DIR=binary.package_dir)
        start = time.monotonic()
        with tempfile.TemporaryFile(mode="w+") as out:
            self.say(f"[tests] {self.stamp()}: started {binary.label()}")
            # Its own session, so a timeout or an interrupt can kill whatever
            # it spawned too.
            with self.lock:
                if self.stopping:
                    return
                proc = subprocess.Popen([binary.executable], cwd=binary.package_dir, env=env,
                                        stdout=out, stderr=subprocess.STDOUT,
                                        start_new_session=True)
                self.running.add(proc)
            try:
                code = proc.wait(timeout=self.timeout)
                binary.outcome = "ok" if code == 0 else f"failed (exit {code})"
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
                binary.outcome = f"killed after {self.timeout:.0f} s"
            with self.lock:
                self.running.discard(proc)
            binary.seconds = time.monotonic() - start
            out.seek(0)
            text = out.read()
        self.say(f"     Running {binary.label()} ({binary.executable})\n"
                 + text + ("" if text.endswith("\n") else "\n")
                 + f"[tests] {self.stamp()}: {binary.label()}: {binary.outcome}"
                 + f" in {binary.seconds:.1f} s")

    def kill_all(self):
        """Kills every running binary's process group (on Ctrl-C or SIGTERM)."""
        with self.lock:
            self.stopping = True
            for proc in self.running:
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass


def interrupted(signum, frame):
    raise KeyboardInterrupt


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=2, help="binaries at once (default 2)")
    parser.add_argument("--alone", default="",
                        help="comma-separated binary names that run one by one, after the rest")
    parser.add_argument("--first", default="",
                        help="comma-separated binary names to start first (the longest ones)")
    parser.add_argument("--timeout", type=float, default=1200,
                        help="seconds before a binary is killed (default 1200)")
    parser.add_argument("cargo_args", nargs=argparse.REMAINDER)
    args = parser.parse_args()
    cargo_args = [a for a in args.cargo_args if a != "--"]
    alone = {n for n in args.alone.split(",") if n}
    first = [n for n in args.first.split(",") if n]

    built, binaries = build(cargo_args)
    names = {b.name for b in binaries}
    for name in sorted((alone | set(first)) - names):
        print(f"[tests] no test binary named {name!r} (--alone/--first)", file=sys.stderr)
        built = False

    rank = {name: i for i, name in enumerate(first)}
    shared = sorted((b for b in binaries if b.name not in alone),
                    key=lambda b: (rank.get(b.name, len(rank)), b.label()))
    solo = sorted((b for b in binaries if b.name in alone), key=lambda b: b.label())

    runner = Runner(args.timeout)
    signal.signal(signal.SIGTERM, interrupted)
    pool = ThreadPoolExecutor(max_workers=max(1, args.jobs))
    try:
        list(pool.map(runner.run, shared))
        pool.shutdown()
        for binary in solo:
            runner.run(binary)
    except KeyboardInterrupt:
        # The binaries run in sessions of their own, out of reach of the
        # terminal's Ctrl-C; without this they would outlive us.
        runner.kill_all()
        print("[tests] interrupted: killed the running test binaries", file=sys.stderr)
        os._exit(130)

    ran = shared + solo
    print(f"\n[tests] {len(ran)} binaries in {runner.stamp().strip()};"
          " wall time per binary, longest first:")
    for b in sorted(ran, key=lambda b: -b.seconds):
        print(f"  {b.seconds:7.1f} s  {b.label():45} {b.package_dir.rsplit('/', 1)[-1]:15} {b.outcome}")
    failures = [b for b in ran if b.outcome != "ok"]
    for b in failures:
        print(f"[tests] FAILED: {b.label()} in {b.package_dir}: {b.outcome}")
    if not built:
        print("[tests] FAILED: the build (see cargo's errors above)")
    sys.exit(0 if built and not failures else 1)


if __name__ == "__main__":
    main()
