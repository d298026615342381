"""A throw-away signing chain shaped like Apple's, for the benchmark scripts (never for production).

root -> intermediate with OID 1.2.840.113635.100.6.2.1 -> leaf with 1.2.840.113635.100.6.11.1;
`AppleLikeChain.sign(payload)` makes a compact JWS with x5c, as the App Store signs its data.
The chain can be saved and loaded, so several processes sign with the same one. Needs the
`cryptography` package.
"""
import base64
import datetime
import json

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.utils import decode_dss_signature
from cryptography.x509.oid import NameOID


def b64url(data):
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _name(common):
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common), x509.NameAttribute(NameOID.ORGANIZATION_NAME, "offer-signer benchmark")])


def _certificate(subject, issuer, public_key, issuer_key, ca, marker=None):
    start = datetime.datetime(2020, 1, 1, tzinfo=datetime.timezone.utc)
    builder = (x509.CertificateBuilder().subject_name(subject).issuer_name(issuer).public_key(public_key)
               .serial_number(x509.random_serial_number()).not_valid_before(start)
               .not_valid_after(datetime.datetime(2040, 1, 1, tzinfo=datetime.timezone.utc))
               .add_extension(x509.BasicConstraints(ca=ca, path_length=0 if ca and marker else None), critical=True)
               .add_extension(x509.KeyUsage(digital_signature=not ca, content_commitment=False, key_encipherment=False,
                                            data_encipherment=False, key_agreement=False, key_cert_sign=ca, crl_sign=ca,
                                            encipher_only=False, decipher_only=False), critical=True))
    if marker:
        builder = builder.add_extension(x509.UnrecognizedExtension(x509.ObjectIdentifier(marker), b"\x05\x00"), critical=False)
    return builder.sign(issuer_key, hashes.SHA256())


class AppleLikeChain:
    def __init__(self, leaf_key, x5c, root_pem):
        self.leaf_key, self.x5c, self.root_pem = leaf_key, x5c, root_pem
        self.header = b64url(json.dumps({"alg": "ES256", "x5c": x5c}, separators=(",", ":")).encode())

    @classmethod
    def generate(cls):
        root_key, intermediate_key, leaf_key = (ec.generate_private_key(ec.SECP256R1()) for _ in range(3))
        root = _certificate(_name("Benchmark Apple Root CA"), _name("Benchmark Apple Root CA"), root_key.public_key(), root_key, True)
        intermediate = _certificate(_name("Benchmark WWDR CA"), root.subject, intermediate_key.public_key(), root_key, True, "1.2.840.113635.100.6.2.1")
        leaf = _certificate(_name("Benchmark Receipt Signing"), intermediate.subject, leaf_key.public_key(), intermediate_key, False,
                            "1.2.840.113635.100.6.11.1")
        x5c = [base64.b64encode(c.public_bytes(serialization.Encoding.DER)).decode() for c in (leaf, intermediate, root)]
        return cls(leaf_key, x5c, root.public_bytes(serialization.Encoding.PEM).decode())

    def save(self, path):
        key = self.leaf_key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()).decode()
        with open(path, "w") as out:
            json.dump({"leafKey": key, "x5c": self.x5c, "rootPEM": self.root_pem}, out)

    @classmethod
    def load(cls, path):
        with open(path) as source:
            state = json.load(source)
        return cls(serialization.load_pem_private_key(state["leafKey"].encode(), None), state["x5c"], state["rootPEM"])

    def write_root(self, path):
        with open(path, "w") as out:
            out.write(self.root_pem)

    def sign(self, payload):
        body = self.header + "." + b64url(json.dumps(payload, separators=(",", ":")).encode())
        r, s = decode_dss_signature(self.leaf_key.sign(body.encode(), ec.ECDSA(hashes.SHA256())))
        return body + "." + b64url(r.to_bytes(32, "big") + s.to_bytes(32, "big"))
