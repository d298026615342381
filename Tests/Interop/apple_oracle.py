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


OPERATIONS = {"legacy-payload": legacy_payload, "legacy-sign": legacy_sign, "jws-sign": jws_sign, "jws-verify": jws_verify}

if __name__ == "__main__":
    cases = json.load(sys.stdin)
    json.dump([OPERATIONS[case["op"]](case) for case in cases], sys.stdout)
