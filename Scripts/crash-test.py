#!/usr/bin/env python3
"""Crash trials for Scripts/crash-test.sh: nothing a client received is ever missing from the audit.

Each trial starts `offer-signer serve` on the same store (so the audit chain grows across every
crash), drives POST /v1/offers/signatures from many keep-alive connections, kills the server with
SIGKILL at a random moment, and then checks, with the server dead:

  * every nonce a client received in a 201 (from this and every earlier trial) is in the ledger
    (issued_signatures) and in exactly one `signature.issued` audit record;
  * no nonce is in two audit records;
  * `offer-signer audit verify` passes (the chain is intact).

Received nonces are appended to a file and flushed after every response, before the next request.
Audit records the server committed but whose response never reached a client (the kill came
between the commit and the send) are allowed: the rule is "audited before it leaves", not the
converse. They are counted as "audited, not received".

Python 3 standard library only. Started by Scripts/crash-test.sh, which prepares the store.
"""

import argparse
import http.client
import json
import os
import random
import signal
import sqlite3
import subprocess
import sys
import threading
import time
import urllib.request
import uuid
import base64


def parse_arguments():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--bin", required=True, help="the offer-signer binary")
    parser.add_argument("--store", required=True)
    parser.add_argument("--master-key-file", required=True)
    parser.add_argument("--work", required=True, help="directory for logs and the received-nonce file")
    parser.add_argument("--trials", type=int, default=200)
    parser.add_argument("--connections", type=int, default=16)
    parser.add_argument("--port", type=int, default=18191)
    parser.add_argument("--formats", default="legacy,jws")
    parser.add_argument("--kill-min", type=float, default=0.2, help="earliest kill, seconds after load starts")
    parser.add_argument("--kill-max", type=float, default=1.5, help="latest kill, seconds after load starts")
    parser.add_argument("--max-seconds", type=float, default=3600, help="stop (and fail) when the run takes longer")
    parser.add_argument("--seed", type=int, default=None)
    return parser.parse_args()


class Received:
    """The nonces clients received in 201 responses: appended to a file and flushed per response."""

    def __init__(self, path):
        self.lock = threading.Lock()
        self.file = open(path, "a", encoding="utf-8")
        self.count = 0

    def record(self, trial, nonces):
        with self.lock:
            for nonce in nonces:
                self.file.write(f"{trial} {nonce}\n")
            self.file.flush()
            self.count += len(nonces)


def nonces_in(body, formats):
    """The nonces of a 201 body: legacy.nonce, and the nonce claim of jws.compactJWS."""
    document = json.loads(body)
    nonces = []
    if "legacy" in formats:
        nonces.append(document["legacy"]["nonce"])
    if "jws" in formats:
        payload = document["jws"]["compactJWS"].split(".")[1]
        payload += "=" * (-len(payload) % 4)
        nonces.append(json.loads(base64.urlsafe_b64decode(payload))["nonce"])
    return nonces


class Load:
    """Connections that each POST signing requests back to back until the server goes away."""

    def __init__(self, port, secret, formats, connections, trial, received):
        self.port, self.secret, self.formats = port, secret, formats
        self.trial, self.received = trial, received
        self.stop = threading.Event()
        self.statuses = {}
        self.lost = 0  # requests sent whose answer never came (the kill)
        self.lock = threading.Lock()
        self.threads = [threading.Thread(target=self.run, daemon=True) for _ in range(connections)]

    def start(self):
        for thread in self.threads:
            thread.start()

    def join(self, timeout):
        deadline = time.monotonic() + timeout
        for thread in self.threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        return not any(thread.is_alive() for thread in self.threads)

    def run(self):
        formats_json = json.dumps(self.formats.split(","))
        headers = {"Content-Type": "application/json", "Authorization": f"Bearer {self.secret}"}
        connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=10)
        while not self.stop.is_set():
            body = ('{"productID":"com.example.crash.monthly","offerID":"CRASH_OFFER",'
                    f'"appAccountToken":"{uuid.uuid4()}","formats":{formats_json}}}')
            try:
                connection.request("POST", "/v1/offers/signatures", body=body, headers=headers)
                response = connection.getresponse()
                answer = response.read()
            except (OSError, http.client.HTTPException):
                # The server was killed: this request's answer is lost; the connection is over.
                with self.lock:
                    self.lost += 1
                break
            with self.lock:
                self.statuses[response.status] = self.statuses.get(response.status, 0) + 1
            if response.status == 201:
                self.received.record(self.trial, nonces_in(answer, self.formats))
        connection.close()


def wait_ready(port, server, timeout):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if server.poll() is not None:
            return False
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=1) as response:
                if response.status == 200:
                    return True
        except OSError:
            pass
        time.sleep(0.05)
    return False


class AuditIndex:
    """How many `signature.issued` records name each nonce, read incrementally from the store."""

    def __init__(self, store):
        self.store = store
        self.last_sequence = 0
        self.records = 0
        self.signature_records = 0
        self.audited = {}  # nonce -> number of signature.issued records naming it

    def update(self):
        # The server is dead; this reads what it left (SQLite recovers the write-ahead log).
        connection = sqlite3.connect(self.store, timeout=30)
        try:
            rows = connection.execute(
                "SELECT seq, kind, body FROM audit_log WHERE seq > ? ORDER BY seq", (self.last_sequence,)).fetchall()
            for sequence, kind, body in rows:
                self.records += 1
                self.last_sequence = sequence
                if kind == "signature.issued":
                    self.signature_records += 1
                    nonce = json.loads(body)["nonce"]
                    self.audited[nonce] = self.audited.get(nonce, 0) + 1
            ledger = set(row[0] for row in connection.execute("SELECT nonce FROM issued_signatures"))
        finally:
            connection.close()
        return ledger


def main():
    arguments = parse_arguments()
    secret = os.environ.get("OFFER_SIGNER_CRASH_SECRET", "")
    if not secret:
        print("error: set OFFER_SIGNER_CRASH_SECRET to the API client's key", file=sys.stderr)
        return 2
    randomness = random.Random(arguments.seed)
    started = time.monotonic()
    received_path = os.path.join(arguments.work, "received-nonces.txt")
    received = Received(received_path)
    index = AuditIndex(arguments.store)
    received_nonces = {}  # nonce -> how many 201 bodies carried it
    received_offset = 0  # how far the received-nonce file has been read
    failures = []
    lost_answers = 0
    statuses = {}
    trials_run = 0
    verify_status = 0
    verify_line = ""

    for trial in range(1, arguments.trials + 1):
        if time.monotonic() - started > arguments.max_seconds:
            failures.append(f"stopped after {trials_run} trials: the run took longer than {arguments.max_seconds:.0f} s")
            break
        log = open(os.path.join(arguments.work, "server.log"), "ab")
        server = subprocess.Popen(
            [arguments.bin, "serve", "--store", arguments.store, "--master-key-file", arguments.master_key_file,
             "--port", str(arguments.port), "--log-level", "warning", "--client-rate", "0", "--token-rate", "0"],
            stdout=log, stderr=log)
        log.close()
        if not wait_ready(arguments.port, server, timeout=60):
            server.kill()
            server.wait()
            failures.append(f"trial {trial}: the server did not become ready (see {arguments.work}/server.log)")
            break

        load = Load(arguments.port, secret, arguments.formats, arguments.connections, trial, received)
        load.start()
        time.sleep(randomness.uniform(arguments.kill_min, arguments.kill_max))
        os.kill(server.pid, signal.SIGKILL)
        server.wait()
        load.stop.set()
        if not load.join(timeout=30):
            failures.append(f"trial {trial}: load connections still running 30 s after the kill")
            break
        trials_run = trial
        lost_answers += load.lost
        for status, count in load.statuses.items():
            statuses[status] = statuses.get(status, 0) + count

        # Check, with the server dead.
        with open(received_path, "rb") as file:
            file.seek(received_offset)
            written = file.read()  # every connection has stopped: no partial line
        received_offset += len(written)
        for line in written.decode("utf-8").splitlines():
            _, nonce = line.split()
            received_nonces[nonce] = received_nonces.get(nonce, 0) + 1
        ledger = index.update()
        missing = [nonce for nonce in received_nonces if index.audited.get(nonce, 0) == 0]
        not_in_ledger = [nonce for nonce in received_nonces if nonce not in ledger]
        doubly_audited = [nonce for nonce, count in index.audited.items() if count > 1]
        doubly_received = [nonce for nonce, count in received_nonces.items() if count > 1]
        verify = subprocess.run([arguments.bin, "audit", "verify", "--store", arguments.store],
                                capture_output=True, text=True, timeout=600)
        verify_status = verify.returncode
        verify_line = verify.stdout.strip().splitlines()[-1] if verify.stdout.strip() else verify.stderr.strip()
        problems = []
        if missing:
            problems.append(f"{len(missing)} received nonces in no audit record (first: {missing[0]})")
        if not_in_ledger:
            problems.append(f"{len(not_in_ledger)} received nonces not in the ledger (first: {not_in_ledger[0]})")
        if doubly_audited:
            problems.append(f"{len(doubly_audited)} nonces in more than one audit record (first: {doubly_audited[0]})")
        if doubly_received:
            problems.append(f"{len(doubly_received)} nonces received twice (first: {doubly_received[0]})")
        if verify_status != 0:
            problems.append(f"audit verify exited {verify_status}: {verify_line}")
        if problems:
            failures.append(f"trial {trial}: " + "; ".join(problems))
            break
        if trial % 20 == 0 or trial == arguments.trials:
            print(f"trial {trial}: {len(received_nonces)} nonces received so far, {index.records} audit records, chain intact",
                  flush=True)

    elapsed = time.monotonic() - started
    received_count = len(received_nonces)
    missing_count = sum(1 for nonce in received_nonces if index.audited.get(nonce, 0) == 0)
    duplicate_count = (sum(1 for count in index.audited.values() if count > 1)
                       + sum(1 for count in received_nonces.values() if count > 1))
    audited_not_received = sum(1 for nonce in index.audited if nonce not in received_nonces)
    other_statuses = ", ".join(f"{status}: {count}" for status, count in sorted(statuses.items()) if status != 201) or "none"
    print()
    print(f"==> crash test results ({trials_run} trials in {elapsed:.0f} s, {arguments.connections} connections, "
          f"formats {arguments.formats}, SIGKILL {arguments.kill_min:g}-{arguments.kill_max:g} s after load starts)")
    print(f"trials:                      {trials_run}")
    print(f"signatures received:         {received_count} (in {statuses.get(201, 0)} responses with status 201)")
    print(f"audit records:               {index.records} ({index.signature_records} signature.issued)")
    print(f"missing (received, not audited): {missing_count}")
    print(f"duplicates:                  {duplicate_count}")
    print(f"audited, not received:       {audited_not_received} (committed, answer cut off by the kill: allowed)")
    print(f"requests cut off by a kill:  {lost_answers}")
    print(f"other statuses:              {other_statuses}")
    print(f"audit verify:                {verify_line} (exit {verify_status})")
    if other_statuses != "none":
        failures.append(f"responses other than 201: {other_statuses}")
    if failures:
        for failure in failures:
            print(f"FAIL: {failure}", file=sys.stderr)
        return 1
    print("PASS: every signature a client received is in the ledger and in exactly one audit record; the chain is intact")
    return 0


if __name__ == "__main__":
    sys.exit(main())
