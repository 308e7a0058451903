"""Adapters that misbehave on purpose, for tests/adapters: crash, hang, garbage of every kind.

    python3 misbehaving_adapter.py MODE      MODE: crash-on-run, segv-on-run, exit-on-run, hang-on-run,
        bad-json, bad-shape, bad-dtype, truncated, wrong-id, huge-header, stdout-print, raise, no-hello,
        bad-hello, flaky (crashes on every 3rd run and computes correctly otherwise), v1 (a correct kernel
        declared as before f16 / bf16 / backward existed: no dtypes, no backward), f16-as-f32 (declares f16,
        answers O in f32), bwd-no-dtypes (declares f32 + f16 and a backward, without backward_dtypes),
        spawn (starts two sleeping children at start-up, one in its process group and one in a session of
        its own with a child of its own, then computes correctly), spawn-hang (the same, then hangs in its
        first run),
        dup-names, neg-max-d, zero-multiple, named-all, paged-feature (hello declarations the tool refuses)
The kernel computes the numpy reference when it is not misbehaving, so a restarted adapter passes.
"""

import json
import os
import signal
import struct
import subprocess
import sys
import time

import numpy as np

from attnfuzz import adapter as A
from attnfuzz.reference import attention

MODE = sys.argv[1]


def main():
    inp, out = A._protocol_streams()
    if MODE.startswith("spawn"):  # descendants the tool must end with the adapter, escaped ones included
        subprocess.Popen(["sleep", "600"])
        subprocess.Popen(["sh", "-c", "sleep 600 & sleep 600"], start_new_session=True)
    runs = 0
    while True:
        msg = A.read_message(inp)
        if msg is None:
            return
        h, payload = msg
        if h["type"] == "hello":
            if MODE == "no-hello":
                time.sleep(3600)
            if MODE == "bad-hello":
                A.write_message(out, {"type": "hello", "protocol": 99, "kernels": []})
                continue
            decl = {"name": "bad-" + MODE, "lse": False}
            if MODE == "f16-as-f32":
                decl["dtypes"] = ["f16"]
            if MODE == "bwd-no-dtypes":
                decl.update(dtypes=["f32", "f16"], backward=True)
            kernels = [decl]
            if MODE == "dup-names":  # hello declarations the tool must refuse (issue 27 item 12)
                kernels = [decl, dict(decl)]
            if MODE == "neg-max-d":
                decl["max_head_dim"] = -5
            if MODE == "zero-multiple":
                decl["head_dim_multiple"] = 0
            if MODE == "named-all":
                decl["name"] = "all"
            if MODE == "paged-feature":  # paged K/V is not carried (PROTOCOL.md "Sequence layouts")
                decl["features"] = ["q-packed", "kv-paged"]
            A.write_message(out, {"type": "hello", "protocol": 1, "name": "misbehaving", "kernels": kernels})
            continue
        if h["type"] != "run":
            return
        runs += 1
        ts = A.split_tensors(h, payload)
        p = A.Problem(h["problem"])
        o, _ = attention(ts["q"], ts["k"], ts["v"], p)
        good = {"type": "result", "id": h["id"], "tensors": [A.tensor_desc("o", o)]}
        if MODE in ("flaky", "v1", "spawn"):
            if MODE == "flaky" and runs % 3 == 0:
                os._exit(3)
            A.write_message(out, good, [o])
        elif MODE == "f16-as-f32":  # values of f16, sent as f32 elements
            A.write_message(out, dict(good, tensors=[A.tensor_desc("o", o, "f32")]), [o])
        elif MODE == "crash-on-run":
            raise SystemExit(5)
        elif MODE == "segv-on-run":
            os.kill(os.getpid(), signal.SIGSEGV)
        elif MODE == "exit-on-run":
            os._exit(0)
        elif MODE in ("hang-on-run", "spawn-hang"):
            time.sleep(3600)
        elif MODE == "bad-json":
            out.write(struct.pack("<I", 9) + b"{not json")
            out.flush()
        elif MODE == "bad-shape":
            bad = np.zeros((o.shape[0], o.shape[1] + 1) + o.shape[2:], np.float32)
            A.write_message(out, {"type": "result", "id": h["id"], "tensors": [A.tensor_desc("o", bad)]}, [bad])
        elif MODE == "bad-dtype":
            o64 = o.astype(np.float64)
            A.write_message(out, {"type": "result", "id": h["id"], "tensors": [A.tensor_desc("o", o64, "f64")]},
                            [o64])
        elif MODE == "truncated":
            blob = o.tobytes()
            hdr = json.dumps(dict(good, payload_bytes=len(blob))).encode()
            out.write(struct.pack("<I", len(hdr)) + hdr + blob[: len(blob) // 2])
            out.flush()
            os._exit(0)
        elif MODE == "wrong-id":
            A.write_message(out, dict(good, id=h["id"] + 7), [o])
        elif MODE == "huge-header":
            out.write(struct.pack("<I", 1 << 30))
            out.flush()
        elif MODE == "stdout-print":  # writes to the real protocol pipe, as a careless adapter would
            out.write(b"hello from a print\n")
            out.flush()
        elif MODE == "raise":
            A.write_message(out, {"type": "error", "id": h["id"], "message": "ValueError: planted"})


if __name__ == "__main__":
    main()
