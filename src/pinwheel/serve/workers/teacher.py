"""The fidelity teacher through transformers (serve/fidelity.py): full log-softmax rows for
every panel window. Arguments: REQUEST_JSON OUT_DIR; writes full.npy and versions.json.
"""

import json
import sys

import numpy as np
import torch
from transformers import AutoModelForCausalLM

req = json.load(open(sys.argv[1]))
out = sys.argv[2]
torch.manual_seed(0)
m = AutoModelForCausalLM.from_pretrained(req["model"], dtype=getattr(torch, req["dtype"])).eval()
total = sum(len(w) - 1 for w in req["windows"])
full = None
at = 0
with torch.no_grad():
    for w in req["windows"]:
        logits = m(torch.tensor([w])).logits[0, :-1].float()
        rows = torch.log_softmax(logits, dim=-1).numpy().astype(np.float32)
        if full is None:  # rows go straight to disk: a large panel never sits in memory
            full = np.lib.format.open_memmap(
                out + "/full.npy", "w+", np.float32, (total, rows.shape[1])
            )
        full[at : at + len(rows)] = rows
        at += len(rows)
if full is None:
    raise SystemExit("the panel has no windows")
full.flush()
del full
json.dump(
    {"transformers": __import__("transformers").__version__, "torch": torch.__version__},
    open(out + "/versions.json", "w"),
)
