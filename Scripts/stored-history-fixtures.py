#!/usr/bin/env python3
"""Fixtures for Scripts/benchmark-stored-history.sh (never for production).

  stored-history-fixtures.py chain STATE ROOT_PEM
      makes a throw-away Apple-like chain, saves it to STATE and its root to ROOT_PEM;
  stored-history-fixtures.py seed STATE URL CUSTOMERS BUNDLE_ID APP_APPLE_ID
      sends each customer's App Store Server Notifications V2 to URL/v1/apple/notifications:
      SUBSCRIBED (INITIAL_BUY) and five DID_RENEW, the last period active now, so the store holds
      every subscription's complete history;
  stored-history-fixtures.py retention STATE OUT COUNT CUSTOMERS APP_APPLE_ID
      writes COUNT signed Retention Messaging request bodies (fresh signedDate, a new
      requestIdentifier each), one per line, for customers taken in turn.

Customer i has originalTransactionId 600000000 + i and appAccountToken 00000000-0000-4000-8000-<i>.
"""
import concurrent.futures
import http.client
import json
import os
import sys
import time
import urllib.parse
import uuid

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from benchmark_apple_chain import AppleLikeChain  # noqa: E402

FIRST_ID = 600_000_000
DAY_MS = 86_400_000
PRODUCT = "com.example.bench.monthly"


def original_id(index):
    return str(FIRST_ID + index)


def token(index):
    return f"00000000-0000-4000-8000-{index:012d}"


def notifications(chain, index, bundle_id, app_apple_id, now_ms):
    original = original_id(index)
    bodies = []
    for month in range(6):
        start = now_ms - (5 - month) * 30 * DAY_MS - 10 * DAY_MS
        transaction = chain.sign({
            "transactionId": original if month == 0 else f"{original}{month:03d}", "originalTransactionId": original,
            "bundleId": bundle_id, "productId": PRODUCT, "subscriptionGroupIdentifier": "BENCHGROUP", "purchaseDate": start,
            "expiresDate": start + 30 * DAY_MS, "type": "Auto-Renewable Subscription", "inAppOwnershipType": "PURCHASED",
            "price": 4990, "currency": "USD", "storefront": "USA", "environment": "Production", "signedDate": start,
            "appAccountToken": token(index)})
        renewal = chain.sign({"originalTransactionId": original, "productId": PRODUCT, "autoRenewProductId": PRODUCT, "autoRenewStatus": 1,
                              "environment": "Production", "signedDate": start})
        payload = {"notificationType": "SUBSCRIBED" if month == 0 else "DID_RENEW", "notificationUUID": str(uuid.uuid4()),
                   "version": "2.0", "signedDate": start,
                   "data": {"bundleId": bundle_id, "environment": "Production", "appAppleId": app_apple_id,
                            "signedTransactionInfo": transaction, "signedRenewalInfo": renewal}}
        if month == 0:
            payload["subtype"] = "INITIAL_BUY"
        bodies.append(json.dumps({"signedPayload": chain.sign(payload)}))
    return bodies


def seed(state, url, customers, bundle_id, app_apple_id):
    chain = AppleLikeChain.load(state)
    target = urllib.parse.urlparse(url)
    now_ms = int(time.time() * 1000)

    def send(indices):
        connection = http.client.HTTPConnection(target.hostname, target.port, timeout=30)
        for index in indices:
            for body in notifications(chain, index, bundle_id, app_apple_id, now_ms):
                connection.request("POST", "/v1/apple/notifications", body, {"Content-Type": "application/json"})
                response = connection.getresponse()
                answer = response.read()
                if response.status != 200:
                    raise SystemExit(f"a notification was answered {response.status}: {answer[:300]!r}")

    workers = 8
    with concurrent.futures.ThreadPoolExecutor(workers) as pool:
        for future in [pool.submit(send, range(start, customers, workers)) for start in range(workers)]:
            future.result()


def retention(state, out, count, customers, app_apple_id):
    chain = AppleLikeChain.load(state)
    now_ms = int(time.time() * 1000)
    with open(out, "w") as lines:
        for number in range(count):
            payload = {"originalTransactionId": original_id(number % customers), "appAppleId": app_apple_id, "productId": PRODUCT,
                       "userLocale": "en-US", "requestIdentifier": str(uuid.uuid4()), "environment": "Production", "signedDate": now_ms}
            lines.write(json.dumps({"signedPayload": chain.sign(payload)}) + "\n")


if __name__ == "__main__":
    command, arguments = sys.argv[1], sys.argv[2:]
    if command == "chain":
        made = AppleLikeChain.generate()
        made.save(arguments[0])
        made.write_root(arguments[1])
    elif command == "seed":
        seed(arguments[0], arguments[1], int(arguments[2]), arguments[3], int(arguments[4]))
    elif command == "retention":
        retention(arguments[0], arguments[1], int(arguments[2]), int(arguments[3]), int(arguments[4]))
    else:
        raise SystemExit(f"unknown command {command!r}; see the docstring")
