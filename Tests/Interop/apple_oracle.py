#!/usr/bin/env python3
"""Independent oracle for offer-signer's interop tests: Apple's App Store Server Library
for Python (app-store-server-library==3.1.2).

Reads a JSON array of cases on stdin, writes a JSON array of results on stdout.
Each case has an "op":
- legacy-payload: the exact bytes Apple's PromotionalOfferSignatureCreator signs (captured
  from the library itself by handing it a recording key), then checks "signature" (ours)
  over them with the public key. -> {"payloadHex", "valid"}
- legacy-sign: a signature made by the library. -> {"signature"}
- jws-sign: a compact JWS made by PromotionalOfferV2SignatureCreator or
  IntroductoryOfferEligibilitySignatureCreator. -> {"compactJWS"}
- jws-verify: decodes and verifies our compact JWS with PyJWT (ES256 only) and returns its
  header and claims. -> {"valid", "header", "claims", "error"?}
- decode-notification: Apple's SignedDataVerifier (trusting "rootDER", offline) verifies and
  decodes an App Store Server Notification V2 signedPayload and its signedTransactionInfo.
  -> {"valid", "notificationType", "subtype", "notificationUUID", "bundleId", "appAppleId",
  "environment", "transactionId", "offerType", "offerIdentifier", "error"?}
- decode-realtime-request: the same for a Retention Messaging request. -> {"valid",
  "originalTransactionId", "appAppleId", "productId", "userLocale", "requestIdentifier",
  "environment", "signedDate", "error"?}
- realtime-response: reads "body" (our answer) into the library's RealtimeResponseBody model and
  writes it back out. -> {"unstructured"}
"""
import base64
import json
import sys
import uuid

import jwt
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ec import ECDSA
from cryptography.hazmat.primitives.hashes import SHA256

from appstoreserverlibrary.jws_signature_creator import (
    IntroductoryOfferEligibilitySignatureCreator,
    PromotionalOfferV2SignatureCreator,
)
from appstoreserverlibrary.promotional_offer import PromotionalOfferSignatureCreator


class RecordingKey:
    """Stands in for the private key to capture the bytes the library signs."""

    def __init__(self, real_key):
        self.real_key = real_key
        self.payload = None

    def sign(self, data, algorithm):
        self.payload = data
        return self.real_key.sign(data, algorithm)


def legacy_creator(case):
    return PromotionalOfferSignatureCreator(case["keyPEM"].encode(), case["keyID"], case["bundleID"])


def legacy_payload(case):
    creator = legacy_creator(case)
    recorder = RecordingKey(creator._signing_key)
    creator._signing_key = recorder
    creator.create_signature(case["productID"], case["offerID"], case["appAccountToken"], uuid.UUID(case["nonce"]), case["timestamp"])
    public_key = serialization.load_pem_private_key(case["keyPEM"].encode(), password=None).public_key()
    try:
        public_key.verify(base64.b64decode(case["signature"], validate=True), recorder.payload, ECDSA(SHA256()))
        valid = True
    except (InvalidSignature, ValueError):
        valid = False
    return {"payloadHex": recorder.payload.hex(), "valid": valid}


def legacy_sign(case):
    signature = legacy_creator(case).create_signature(
        case["productID"], case["offerID"], case["appAccountToken"], uuid.UUID(case["nonce"]), case["timestamp"])
    return {"signature": signature}


def jws_sign(case):
    args = (case["keyPEM"].encode(), case["keyID"], case["issuerID"], case["bundleID"])
    if case["kind"] == "promotional-offer":
        token = PromotionalOfferV2SignatureCreator(*args).create_signature(case["productID"], case["offerID"], case.get("transactionID"))
    else:
        token = IntroductoryOfferEligibilitySignatureCreator(*args).create_signature(
            case["productID"], case["allowIntroductoryOffer"], case["transactionID"])
    return {"compactJWS": token}


def jws_verify(case):
    public_key = serialization.load_pem_public_key(case["publicKeyPEM"].encode())
    token = case["compactJWS"]
    try:
        claims = jwt.decode(token, public_key, algorithms=["ES256"], audience=case["audience"],
                            options={"require": ["iat", "aud", "iss"]})
        return {"valid": True, "header": jwt.get_unverified_header(token), "claims": claims}
    except jwt.PyJWTError as error:
        return {"valid": False, "error": str(error)}


def _verifier(case):
    from appstoreserverlibrary.models.Environment import Environment
    from appstoreserverlibrary.signed_data_verifier import SignedDataVerifier
    return SignedDataVerifier([base64.b64decode(case["rootDER"])], False, Environment(case["environment"]), case["bundleId"],
                              case.get("appAppleId"))


def _raw(model, name):
    value = getattr(model, "raw" + name[0].upper() + name[1:], None)
    return value if value is not None else getattr(model, name, None)


def decode_notification(case):
    verifier = _verifier(case)
    try:
        payload = verifier.verify_and_decode_notification(case["signedPayload"])
        data = payload.data
        transaction = verifier.verify_and_decode_signed_transaction(data.signedTransactionInfo) if data and data.signedTransactionInfo else None
    except Exception as error:  # VerificationException and its kin
        return {"valid": False, "error": repr(error)}
    return {"valid": True, "notificationType": _raw(payload, "notificationType"), "subtype": _raw(payload, "subtype"),
            "notificationUUID": payload.notificationUUID, "bundleId": data.bundleId if data else None,
            "appAppleId": data.appAppleId if data else None, "environment": _raw(data, "environment") if data else None,
            "transactionId": transaction.transactionId if transaction else None,
            "offerType": _raw(transaction, "offerType") if transaction else None,
            "offerIdentifier": transaction.offerIdentifier if transaction else None}


def decode_realtime_request(case):
    try:
        payload = _verifier(case).verify_and_decode_realtime_request(case["signedPayload"])
    except Exception as error:
        return {"valid": False, "error": repr(error)}
    return {"valid": True, "originalTransactionId": payload.originalTransactionId, "appAppleId": payload.appAppleId,
            "productId": payload.productId, "userLocale": payload.userLocale, "requestIdentifier": str(payload.requestIdentifier),
            "environment": _raw(payload, "environment"), "signedDate": payload.signedDate}


def realtime_response(case):
    from appstoreserverlibrary.models.LibraryUtility import _get_cattrs_converter
    from appstoreserverlibrary.models.RealtimeResponseBody import RealtimeResponseBody
    converter = _get_cattrs_converter(RealtimeResponseBody)
    body = converter.structure(case["body"], RealtimeResponseBody)
    return {"unstructured": json.loads(json.dumps(converter.unstructure(body), default=str))}


OPERATIONS = {"legacy-payload": legacy_payload, "legacy-sign": legacy_sign, "jws-sign": jws_sign, "jws-verify": jws_verify,
              "decode-notification": decode_notification, "decode-realtime-request": decode_realtime_request,
              "realtime-response": realtime_response}

if __name__ == "__main__":
    cases = json.load(sys.stdin)
    json.dump([OPERATIONS[case["op"]](case) for case in cases], sys.stdout)
