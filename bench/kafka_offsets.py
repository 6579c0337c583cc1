"""The end offset of a topic, from Kafka's ListOffsets API (version 1),
with Python's standard library only: bench/run reads how far Debezium has
written into Kafka without starting a JVM per look (Kafka's GetOffsetShell
takes a second of CPU each time, on the 2 cores the benchmark measures).

The stack has one broker, the leader of every partition, so the request goes
to the bootstrap server. A topic's end offset counts its records, and for a
transactional producer its commit markers too (Debezium's is not one).
"""

import socket
import struct

LIST_OFFSETS = 2
VERSION = 1
LATEST = -1
# Partitions asked for; those the topic does not have answer with an error
# and count for nothing.
MAX_PARTITIONS = 16


def _string(s):
    b = s.encode()
    return struct.pack(">h", len(b)) + b


def _recv(sock, n):
    out = b""
    while len(out) < n:
        chunk = sock.recv(n - len(out))
        if not chunk:
            raise ConnectionError("kafka closed the connection")
        out += chunk
    return out


def end_offset(bootstrap, topic, timeout=5.0):
    """The sum of the latest offsets of the topic's partitions (0 while the
    topic does not exist)."""
    host, port = bootstrap.split(",")[0].rsplit(":", 1)
    parts = b"".join(struct.pack(">iq", p, LATEST) for p in range(MAX_PARTITIONS))
    body = struct.pack(">i", -1) + struct.pack(">i", 1) + _string(topic) + struct.pack(">i", MAX_PARTITIONS) + parts
    header = struct.pack(">hhi", LIST_OFFSETS, VERSION, 1) + _string("tributary-bench")
    msg = header + body
    with socket.create_connection((host, int(port)), timeout=timeout) as s:
        s.sendall(struct.pack(">i", len(msg)) + msg)
        size = struct.unpack(">i", _recv(s, 4))[0]
        data = _recv(s, size)
    pos = 4  # correlation id
    total = 0
    (ntopics,) = struct.unpack_from(">i", data, pos)
    pos += 4
    for _ in range(ntopics):
        (n,) = struct.unpack_from(">h", data, pos)
        pos += 2 + n
        (nparts,) = struct.unpack_from(">i", data, pos)
        pos += 4
        for _ in range(nparts):
            _, err, _, offset = struct.unpack_from(">ihqq", data, pos)
            pos += 22
            if err == 0:
                total += offset
    return total


if __name__ == "__main__":
    import sys
    print(end_offset(sys.argv[1], sys.argv[2]))
