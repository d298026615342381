#!/usr/bin/env python3
"""A fake App Store Server API for Scripts/benchmark-apple-history.sh (never for production).

Serves GET /production/inApps/v2/history/{id} and GET /production/inApps/v1/subscriptions/{id}
for CUSTOMERS customers (any all-digit transaction ID N names customer 500000000 + N % CUSTOMERS, so a
benchmark can use a new ID, and so miss the service's cache, on every request), each a lapsed
subscriber (TRANSACTIONS paid months, six by default, that ended two months ago), answering after
DELAY_MS milliseconds. Every answer for a customer is the same bytes (items signed once, at start).
Items are signed like the App Store signs them, by a throw-away chain shaped like Apple's
(root -> intermediate with OID 1.2.840.113635.100.6.2.1 -> leaf with 1.2.840.113635.100.6.11.1);
the root is written to ROOT_PEM for `offer-signer serve --apple-root`. Requests without an ES256
bearer token (three base64url parts, header alg ES256 and typ JWT) are answered 401.

Usage: fake-app-store-server-api.py PORT ROOT_PEM CUSTOMERS DELAY_MS BUNDLE_ID [TRANSACTIONS]
Prints "ready" on stdout once it listens. Needs the `cryptography` package.
"""
import asyncio
import base64
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from benchmark_apple_chain import AppleLikeChain  # noqa: E402

PORT, ROOT_PEM, CUSTOMERS, DELAY_MS, BUNDLE_ID = int(sys.argv[1]), sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
TRANSACTIONS = int(sys.argv[6]) if len(sys.argv) > 6 else 6
FIRST_ID = 500_000_000

CHAIN = AppleLikeChain.generate()
CHAIN.write_root(ROOT_PEM)
sign = CHAIN.sign


DAY_MS = 86_400_000
now_ms = int(time.time() * 1000)
HISTORY, STATUSES = {}, {}
for index in range(CUSTOMERS):
    original = str(FIRST_ID + index)
    transactions = []
    for month in range(TRANSACTIONS):
        start = now_ms - (TRANSACTIONS + 2 - month) * 30 * DAY_MS
        transactions.append(sign({
            "transactionId": original if month == 0 else f"{original}{month:03d}", "originalTransactionId": original,
            "bundleId": BUNDLE_ID, "productId": "com.example.bench.monthly", "subscriptionGroupIdentifier": "BENCHGROUP",
            "purchaseDate": start, "expiresDate": start + 30 * DAY_MS, "type": "Auto-Renewable Subscription",
            "inAppOwnershipType": "PURCHASED", "price": 4990, "currency": "USD", "storefront": "USA",
            "environment": "Production", "signedDate": start}))
    HISTORY[original] = json.dumps({"revision": "end", "hasMore": False, "bundleId": BUNDLE_ID, "appAppleId": 1234567890,
                                    "environment": "Production", "signedTransactions": transactions}).encode()
    renewal = sign({"originalTransactionId": original, "productId": "com.example.bench.monthly", "autoRenewStatus": 0,
                    "environment": "Production", "signedDate": now_ms})
    STATUSES[original] = json.dumps({"environment": "Production", "bundleId": BUNDLE_ID, "appAppleId": 1234567890, "data": [
        {"subscriptionGroupIdentifier": "BENCHGROUP", "lastTransactions": [
            {"originalTransactionId": original, "status": 2, "signedTransactionInfo": transactions[-1], "signedRenewalInfo": renewal}]}]}).encode()
NOT_FOUND = b'{"errorCode":4040010,"errorMessage":"Transaction id not found."}'

open_connections = 0
peak_connections = 0


def answer(status, body):
    reason = {200: "OK", 401: "Unauthorized", 404: "Not Found"}[status]
    return (f"HTTP/1.1 {status} {reason}\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n").encode() + body


async def respond(path, authorization):
    if path == "/stats":
        return answer(200, json.dumps({"peakConnections": peak_connections}).encode())
    parts = authorization[len("Bearer "):].split(".") if authorization.startswith("Bearer ") else []
    try:
        header = json.loads(base64.urlsafe_b64decode(parts[0] + "=" * (-len(parts[0]) % 4))) if len(parts) == 3 else {}
    except ValueError:
        header = {}
    if header.get("alg") != "ES256" or header.get("typ") != "JWT":
        return answer(401, b"")
    await asyncio.sleep(DELAY_MS / 1000)
    segments = path.split("?")[0].strip("/").split("/")
    table = HISTORY if segments[1:4] == ["inApps", "v2", "history"] else STATUSES if segments[1:4] == ["inApps", "v1", "subscriptions"] else None
    customer = str(FIRST_ID + int(segments[-1]) % CUSTOMERS) if len(segments) == 5 and segments[-1].isdigit() else ""
    if table is None or customer not in table:
        return answer(404, NOT_FOUND)
    return answer(200, table[customer])


async def connection(reader, writer):
    """HTTP/1.1 keep-alive, GET only: one request at a time per connection."""
    global open_connections, peak_connections
    open_connections += 1
    peak_connections = max(peak_connections, open_connections)
    try:
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            lines = head.decode("latin-1").split("\r\n")
            path = lines[0].split(" ")[1]
            headers = {line.split(":", 1)[0].strip().lower(): line.split(":", 1)[1].strip() for line in lines[1:] if ":" in line}
            writer.write(await respond(path, headers.get("authorization", "")))
            await writer.drain()
    except (asyncio.IncompleteReadError, ConnectionError, IndexError):
        pass
    finally:
        open_connections -= 1
        writer.close()


async def main():
    server = await asyncio.start_server(connection, "127.0.0.1", PORT, backlog=2048)
    print("ready", flush=True)
    async with server:
        await server.serve_forever()


asyncio.run(main())
