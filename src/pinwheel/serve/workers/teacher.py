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
rows = []
with torch.no_grad():
    for w in req["windows"]:
        logits = m(torch.tensor([w])).logits[0, :-1].float()
        rows.append(torch.log_softmax(logits, dim=-1).numpy())
lp = np.concatenate(rows).astype(np.float32)
np.save(out + "/full.npy", lp)
json.dump(
    {"transformers": __import__("transformers").__version__, "torch": torch.__version__},
    open(out + "/versions.json", "w"),
)
