# Shared by the TLS tests: throwaway CAs and certificates from trustme,
# written to files as operators configure them (tls.server.certPath, ...).
import attrs
import trustme


@attrs.frozen
class TlsFiles:
    ca: str            # the CA bundle clients trust
    cert: str          # server certificate chain (127.0.0.1, localhost)
    key: str
    client_cert: str   # a client certificate from the same CA (mutual TLS)
    client_key: str
    other_ca: str      # a CA that signed none of these

    def server_props(self, mode: str = "enforcing", **more) -> dict:
        return {"tls.server.mode": mode, "tls.server.certPath": self.cert, "tls.server.keyPath": self.key, **more}


def make_tls_files(directory, names=("127.0.0.1", "localhost")) -> TlsFiles:
    directory.mkdir(parents=True, exist_ok=True)
    ca, other = trustme.CA(), trustme.CA()
    server = ca.issue_cert(*names)
    client = ca.issue_cert("client.example")
    paths = {name: str(directory / f"{name}.pem") for name in
             ("ca", "cert", "key", "client_cert", "client_key", "other_ca")}
    ca.cert_pem.write_to_path(paths["ca"])
    other.cert_pem.write_to_path(paths["other_ca"])
    server.private_key_pem.write_to_path(paths["key"])
    with open(paths["cert"], "wb") as f:
        for blob in server.cert_chain_pems:
            f.write(blob.bytes())
    client.private_key_pem.write_to_path(paths["client_key"])
    with open(paths["client_cert"], "wb") as f:
        for blob in client.cert_chain_pems:
            f.write(blob.bytes())
    return TlsFiles(**paths)
