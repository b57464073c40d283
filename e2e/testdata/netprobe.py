#!/usr/bin/env python3
"""Network probes run inside a sandbox by the network tests.

Reads a JSON list of checks from argv[1] and prints one JSON list of
results. Each check is a dict with "op" and its arguments; each result
has "ok" (the operation succeeded) and what it saw, or "error".
"""
import json
import socket
import ssl
import struct
import sys
import time


def dns(c):
    infos = socket.getaddrinfo(c["name"], None, socket.AF_INET, socket.SOCK_STREAM)
    return {"addrs": sorted({i[4][0] for i in infos})}


def dns6(c):
    infos = socket.getaddrinfo(c["name"], None, socket.AF_INET6, socket.SOCK_STREAM)
    return {"addrs": sorted({i[4][0] for i in infos})}


def connect(ip, port, timeout):
    s = socket.create_connection((ip, port), timeout=timeout)
    s.settimeout(timeout)
    return s


def http(c):
    """An HTTP/1.1 GET to ip:port with the given Host (and SNI with tls)."""
    timeout = c.get("timeout", 5)
    # The context (reading the CA bundle: slow under emulation) is made
    # before connecting, so that the ClientHello follows the connect at
    # once, well within the gateway's wait for a flow's first bytes.
    ctx = None
    if c.get("tls"):
        ctx = ssl.create_default_context(cafile=c.get("cafile"))
        if c.get("insecure"):
            ctx.check_hostname = False
            ctx.verify_mode = ssl.CERT_NONE
    s = connect(c["ip"], c["port"], timeout)
    if ctx:
        s = ctx.wrap_socket(s, server_hostname=c.get("sni", c["host"]))
    headers = "".join("%s: %s\r\n" % (k, v) for k, v in c.get("headers", {}).items())
    req = "GET %s HTTP/1.1\r\nHost: %s\r\n%sConnection: close\r\n\r\n" % (c.get("path", "/"), c["host"], headers)
    s.sendall(req.encode())
    data = b""
    while True:
        b = s.recv(65536)
        if not b:
            break
        data += b
    s.close()
    if not data:
        raise ConnectionError("closed without an answer")
    head, _, body = data.partition(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1])
    return {"status": status, "body": body.decode("utf-8", "replace")}


def tcp(c):
    """Connect, optionally send, and read what comes back until close or timeout."""
    timeout = c.get("timeout", 3)
    s = connect(c["ip"], c["port"], timeout)
    if c.get("send"):
        s.sendall(c["send"].encode())
    got = b""
    try:
        while len(got) < 4096:
            b = s.recv(4096)
            if not b:
                break
            got += b
            # "first": an echo is expected, so stop once as many bytes as
            # were sent are back (an answer may come in several segments).
            if c.get("first") and len(got) >= max(1, len(c.get("send", ""))):
                break
    except socket.timeout:
        pass
    s.close()
    return {"data": got.decode("utf-8", "replace")}


def tcp6(c):
    s = socket.socket(socket.AF_INET6, socket.SOCK_STREAM)
    s.settimeout(c.get("timeout", 3))
    s.connect((c["ip"], c["port"]))
    s.close()
    return {}


def udp(c):
    """Send a datagram (a DNS query when "dns" names a query) and wait for any answer."""
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.settimeout(c.get("timeout", 2))
    payload = c.get("send", "ping").encode()
    if c.get("dns"):
        payload = dns_query(c["dns"])
    s.sendto(payload, (c["ip"], c["port"]))
    try:
        data, _ = s.recvfrom(4096)
        return {"answered": True, "bytes": len(data)}
    except socket.timeout:
        return {"answered": False}


def dns_query(name):
    q = struct.pack(">HHHHHH", 0x1234, 0x0100, 1, 0, 0, 0)
    for label in name.split("."):
        q += bytes([len(label)]) + label.encode()
    return q + b"\x00" + struct.pack(">HH", 1, 1)


def icmp(c):
    """One ICMP echo; answered says whether any reply came."""
    s = socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP)
    s.settimeout(c.get("timeout", 2))
    body = b"airlock-probe"
    hdr = struct.pack(">BBHHH", 8, 0, 0, 0x4242, 1)
    csum = checksum(hdr + body)
    pkt = struct.pack(">BBHHH", 8, 0, csum, 0x4242, 1) + body
    s.sendto(pkt, (c["ip"], 0))
    try:
        s.recvfrom(4096)
        return {"answered": True}
    except socket.timeout:
        return {"answered": False}


def checksum(b):
    if len(b) % 2:
        b += b"\0"
    total = sum(struct.unpack(">%dH" % (len(b) // 2), b))
    total = (total >> 16) + (total & 0xFFFF)
    total += total >> 16
    return ~total & 0xFFFF


def hold(c):
    """Connect, then read until the connection ends; report how long it lasted.
    With "progress", print a line "got N bytes" on stdout at each read."""
    s = connect(c["ip"], c["port"], c.get("timeout", 30))
    if c.get("send"):
        s.sendall(c["send"].encode())
    start = time.time()
    n = 0
    try:
        while True:
            b = s.recv(4096)
            if not b:
                break
            n += len(b)
            if c.get("progress"):
                print("got %d bytes" % n, flush=True)
    except (ConnectionError, socket.timeout) as e:
        return {"lasted": time.time() - start, "bytes": n, "end": type(e).__name__}
    return {"lasted": time.time() - start, "bytes": n, "end": "eof"}


OPS = {"dns": dns, "dns6": dns6, "http": http, "tcp": tcp, "tcp6": tcp6, "udp": udp, "icmp": icmp, "hold": hold}


def main():
    checks = json.loads(sys.argv[1])
    out = []
    for c in checks:
        try:
            r = OPS[c["op"]](c)
            r["ok"] = True
        except Exception as e:  # the probe reports every failure as data
            r = {"ok": False, "error": "%s: %s" % (type(e).__name__, e)}
        out.append(r)
    print(json.dumps(out))


main()
