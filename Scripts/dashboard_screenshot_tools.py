#!/usr/bin/env python3
"""Helpers of Scripts/dashboard-screenshot.sh (standard library only, plus `cryptography` for `fill`).

  dashboard_screenshot_tools.py fill URL CHAIN_STATE SECRET BUNDLE_ID APP_APPLE_ID PHASE
      fills a running server through its real endpoints. PHASE `before-rotation`: signatures
      (POST /v1/offers/signatures) for two offers, every customer's App Store Server Notifications
      V2 (six months of history each), redemptions of signed offers (matched) and one with an
      appAccountToken nothing of ours signed (a possible key leak), and Retention Messaging
      requests (POST /v1/apple/retention): three answered with the offer, one for a customer the
      store does not know (the App Store Server API is asked, at a closed port: a fallback). PHASE `after-rotation`: more signatures (by the new key).
  dashboard_screenshot_tools.py proxy UPSTREAM TOKEN_FILE PORT_FILE
      a loopback HTTP proxy for GET requests that adds `Authorization: Bearer <token>` (headless
      Chromium cannot send a header; the token never goes into a URL); writes the port it
      listens on to PORT_FILE, then serves until killed.
  dashboard_screenshot_tools.py check-page HTML_FILE PAGE NEEDS_CHART
      the page names itself (`<main data-page="PAGE">`) and, when NEEDS_CHART is 1, has an inline
      `<svg class="chart">` that draws at least one data mark (rect, path, circle, line, …);
      exit 1 with the reason otherwise.
  dashboard_screenshot_tools.py check-png PNG_FILE [MIN_COLOURS]
      decodes the PNG (zlib, scanline filters; 8-bit RGB or RGBA, not interlaced) and exits 1
      when it has at most MIN_COLOURS (default 4) distinct colours: a blank page.

Customers are those of Scripts/stored-history-fixtures.py (originalTransactionId 600000000 + i,
appAccountToken 00000000-0000-4000-8000-<i>).
"""
import html.parser
import http.client
import http.server
import importlib.util
import json
import os
import struct
import sys
import threading
import time
import urllib.parse
import uuid
import zlib

HERE = os.path.dirname(os.path.abspath(__file__))
PRODUCT = "com.example.bench.monthly"
CUSTOMERS = 6
DAY_MS = 86_400_000


def fixtures():
    """Scripts/stored-history-fixtures.py as a module (its name has hyphens)."""
    sys.path.insert(0, HERE)
    spec = importlib.util.spec_from_file_location("stored_history_fixtures", os.path.join(HERE, "stored-history-fixtures.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def request(url, method, path, body=None, headers=None):
    target = urllib.parse.urlparse(url)
    connection = http.client.HTTPConnection(target.hostname, target.port, timeout=30)
    connection.request(method, path, body, headers or {})
    response = connection.getresponse()
    answer = response.read()
    connection.close()
    return response.status, answer


def expect(status, answer, wanted, what):
    if status not in wanted:
        raise SystemExit(f"error: {what} was answered {status}: {answer[:400].decode(errors='replace')}")


def sign_offer(url, secret, offer_id, token, formats=("legacy", "jws")):
    body = json.dumps({"productID": PRODUCT, "offerID": offer_id, "appAccountToken": token, "formats": list(formats)})
    status, answer = request(url, "POST", "/v1/offers/signatures", body,
                             {"Content-Type": "application/json", "Authorization": f"Bearer {secret}"})
    expect(status, answer, (201,), f"POST /v1/offers/signatures for {offer_id}")


def notify(url, chain, payload):
    status, answer = request(url, "POST", "/v1/apple/notifications", json.dumps({"signedPayload": chain.sign(payload)}),
                             {"Content-Type": "application/json"})
    expect(status, answer, (200,), f"a {payload['notificationType']} notification")
    return json.loads(answer)


def redemption(chain, bundle_id, app_apple_id, original, transaction_id, offer_id, token, now_ms):
    """A resubscription bought with a promotional offer (offerType 2), as Apple notifies it."""
    transaction = chain.sign({
        "transactionId": transaction_id, "originalTransactionId": original, "bundleId": bundle_id, "productId": PRODUCT,
        "subscriptionGroupIdentifier": "BENCHGROUP", "purchaseDate": now_ms, "originalPurchaseDate": now_ms - 200 * DAY_MS,
        "expiresDate": now_ms + 30 * DAY_MS, "type": "Auto-Renewable Subscription", "inAppOwnershipType": "PURCHASED",
        "offerType": 2, "offerIdentifier": offer_id, "transactionReason": "PURCHASE", "price": 2490, "currency": "USD",
        "storefront": "USA", "environment": "Production", "signedDate": now_ms, "appAccountToken": token})
    renewal = chain.sign({"originalTransactionId": original, "productId": PRODUCT, "autoRenewProductId": PRODUCT, "autoRenewStatus": 1,
                          "environment": "Production", "signedDate": now_ms})
    return {"notificationType": "SUBSCRIBED", "subtype": "RESUBSCRIBE", "notificationUUID": str(uuid.uuid4()), "version": "2.0",
            "signedDate": now_ms, "data": {"bundleId": bundle_id, "environment": "Production", "appAppleId": app_apple_id,
                                           "signedTransactionInfo": transaction, "signedRenewalInfo": renewal}}


def fill(url, state, secret, bundle_id, app_apple_id, phase):
    history = fixtures()
    if phase == "after-rotation":
        for index in range(CUSTOMERS):
            sign_offer(url, secret, "WINBACK50", history.token(100 + index), ("legacy",))
        print("filled: after the rotation, 6 signatures by the new key")
        return
    from benchmark_apple_chain import AppleLikeChain
    chain = AppleLikeChain.load(state)
    now_ms = int(time.time() * 1000)
    # Every customer's history (six paid months, the last one active), as notifications.
    history.seed(state, url, CUSTOMERS, bundle_id, app_apple_id)
    # Signatures: WINBACK50 for every customer, SPRING20 for half of them.
    for index in range(CUSTOMERS):
        sign_offer(url, secret, "WINBACK50", history.token(index))
        if index % 2 == 0:
            sign_offer(url, secret, "SPRING20", history.token(index), ("jws",))
    # Redemptions: customers 0 and 1 bought WINBACK50 with the token we signed for (matched);
    # customer 2 bought it with a token nothing of ours signed for (a possible key leak).
    outcomes = []
    for index, token in ((0, history.token(0)), (1, history.token(1)), (2, "0badc0de-0000-4000-8000-000000000002")):
        original = history.original_id(index)
        payload = redemption(chain, bundle_id, app_apple_id, original, f"{original}900", "WINBACK50", token, now_ms - 60_000 + index)
        outcomes.append(notify(url, chain, payload).get("status"))
    # Retention Messaging: customers 3 to 5 (eligible: six paid months, active) get the offer; a
    # customer the store does not know makes the service ask Apple's API (a closed port here:
    # a network error, counted, and the product's fallback message with its reason).
    answers = []
    for original in [history.original_id(3), history.original_id(4), history.original_id(5), "699999999"]:
        body = json.dumps({"signedPayload": chain.sign({
            "originalTransactionId": original, "appAppleId": app_apple_id, "productId": PRODUCT, "userLocale": "en-US",
            "requestIdentifier": str(uuid.uuid4()), "environment": "Production", "signedDate": int(time.time() * 1000)})})
        status, answer = request(url, "POST", "/v1/apple/retention", body, {"Content-Type": "application/json"})
        expect(status, answer, (200, 204), "a Retention Messaging request")
        answers.append(next(iter(json.loads(answer)), "?") if status == 200 and answer else str(status))
    print(f"filled: {CUSTOMERS} customers' notifications, {CUSTOMERS + (CUSTOMERS + 1) // 2} signatures, "
          f"3 redemptions ({', '.join(str(o) for o in outcomes)}), retention answers {', '.join(answers)}")


class AuthorizingProxy(http.server.BaseHTTPRequestHandler):
    upstream = None
    token = None
    protocol_version = "HTTP/1.1"

    def do_GET(self):
        target = urllib.parse.urlparse(self.upstream)
        connection = http.client.HTTPConnection(target.hostname, target.port, timeout=60)
        try:
            connection.request("GET", self.path, headers={"Authorization": f"Bearer {self.token}", "Accept": self.headers.get("Accept", "*/*")})
            response = connection.getresponse()
            body = response.read()
        except OSError as error:
            self.send_error(502, f"upstream: {error}")
            return
        finally:
            connection.close()
        self.send_response(response.status)
        for name, value in response.getheaders():
            if name.lower() not in ("content-length", "transfer-encoding", "connection"):
                self.send_header(name, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format, *args):
        sys.stderr.write("proxy: " + (format % args) + "\n")


def proxy(upstream, token_file, port_file):
    with open(token_file) as source:
        AuthorizingProxy.token = source.read().strip()
    AuthorizingProxy.upstream = upstream
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), AuthorizingProxy)
    with open(port_file + ".tmp", "w") as out:
        out.write(str(server.server_address[1]))
    os.replace(port_file + ".tmp", port_file)
    server.serve_forever()


class PageScan(html.parser.HTMLParser):
    """The page's `<main data-page>` values and, per `<svg class="chart …">`, how many data marks it draws."""
    MARKS = {"rect", "circle", "path", "polyline", "polygon", "line", "ellipse"}

    def __init__(self):
        super().__init__()
        self.pages, self.charts, self.empty_states, self.depth = [], [], 0, 0

    def handle_starttag(self, tag, attrs):
        attributes = dict(attrs)
        classes = (attributes.get("class") or "").split()
        if tag == "main" and "data-page" in attributes:
            self.pages.append(attributes["data-page"])
        if tag == "p" and "empty" in classes:
            self.empty_states += 1
        if tag == "svg":
            if self.depth == 0 and "chart" in classes:
                self.charts.append(0)
                self.depth = 1
            elif self.depth:
                self.depth += 1
        elif self.depth and tag in self.MARKS:
            self.charts[-1] += 1

    def handle_startendtag(self, tag, attrs):
        self.handle_starttag(tag, attrs)
        if tag == "svg" and self.depth:
            self.depth -= 1

    def handle_endtag(self, tag):
        if tag == "svg" and self.depth:
            self.depth -= 1


def check_page(path, page, needs_chart):
    with open(path, encoding="utf-8", errors="replace") as source:
        scan = PageScan()
        scan.feed(source.read())
    problems = []
    if page not in scan.pages:
        problems.append(f'no <main data-page="{page}"> (found {scan.pages or "none"})')
    drawn = [marks for marks in scan.charts if marks > 0]
    if needs_chart == "1" and not drawn:
        problems.append(f'no chart with data marks (<svg class="chart"> elements: {len(scan.charts)}, empty states: {scan.empty_states})')
    if problems:
        raise SystemExit(f"error: /admin/{page}: " + "; ".join(problems))
    print(f"/admin/{page}: {len(scan.charts)} chart(s), {sum(scan.charts)} data marks, {scan.empty_states} empty state(s)")


def png_colours(path, stop_after=64):
    """Distinct colours of an 8-bit RGB(A) PNG, counting up to `stop_after`."""
    with open(path, "rb") as source:
        data = source.read()
    if data[:8] != b"\x89PNG\r\n\x1a\n":
        raise SystemExit(f"error: {path} is not a PNG")
    position, idat, header = 8, [], None
    while position < len(data):
        length, kind = struct.unpack(">I4s", data[position:position + 8])
        chunk = data[position + 8:position + 8 + length]
        if kind == b"IHDR":
            header = struct.unpack(">IIBBBBB", chunk)
        elif kind == b"IDAT":
            idat.append(chunk)
        elif kind == b"IEND":
            break
        position += 12 + length
    if header is None:
        raise SystemExit(f"error: {path} has no IHDR")
    width, height, depth, colour_type, _, _, interlace = header
    if depth != 8 or colour_type not in (2, 6) or interlace:
        raise SystemExit(f"error: {path}: only 8-bit RGB/RGBA, non-interlaced PNGs are checked (depth {depth}, type {colour_type})")
    pixel = 3 if colour_type == 2 else 4
    stride = width * pixel
    raw = zlib.decompress(b"".join(idat))
    if len(raw) != height * (stride + 1):
        raise SystemExit(f"error: {path}: image data of {len(raw)} bytes, expected {height * (stride + 1)}")
    colours = set()
    previous = bytearray(stride)
    for row in range(height):
        start = row * (stride + 1)
        kind, line = raw[start], bytearray(raw[start + 1:start + 1 + stride])
        if kind == 1:
            for i in range(pixel, stride):
                line[i] = (line[i] + line[i - pixel]) & 0xFF
        elif kind == 2:
            line = bytearray((a + b) & 0xFF for a, b in zip(line, previous))
        elif kind == 3:
            for i in range(stride):
                left = line[i - pixel] if i >= pixel else 0
                line[i] = (line[i] + ((left + previous[i]) >> 1)) & 0xFF
        elif kind == 4:
            for i in range(stride):
                a = line[i - pixel] if i >= pixel else 0
                b = previous[i]
                c = previous[i - pixel] if i >= pixel else 0
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                line[i] = (line[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 0xFF
        elif kind != 0:
            raise SystemExit(f"error: {path}: unknown scanline filter {kind} in row {row}")
        # Sample every 4th pixel of the row: enough to tell a blank page from a drawn one.
        for i in range(0, stride, pixel * 4):
            colours.add(bytes(line[i:i + 3]))
        if len(colours) > stop_after:
            break
        previous = line
    return colours


def check_png(path, minimum):
    colours = png_colours(path)
    if len(colours) <= minimum:
        raise SystemExit(f"error: {path} is blank: {len(colours)} distinct colour(s)")
    print(f"{os.path.basename(path)}: {'more than 64' if len(colours) > 64 else len(colours)} colours")


if __name__ == "__main__":
    if len(sys.argv) < 2:
        raise SystemExit(__doc__)
    command, arguments = sys.argv[1], sys.argv[2:]
    if command == "fill" and len(arguments) == 6:
        fill(arguments[0], arguments[1], arguments[2], arguments[3], int(arguments[4]), arguments[5])
    elif command == "proxy" and len(arguments) == 3:
        proxy(*arguments)
    elif command == "check-page" and len(arguments) == 3:
        check_page(*arguments)
    elif command == "check-png" and len(arguments) in (1, 2):
        check_png(arguments[0], int(arguments[1]) if len(arguments) == 2 else 4)
    else:
        raise SystemExit(f"unknown command or arguments: {' '.join(sys.argv[1:])!r}; see the docstring")
