# MeSH 4+8R2+4 (n_slots = 5): 1.4B with Pythia-1B's unique parameters at 24-layer compute.
# Pythia-1.4B shape (GPT-NeoX layers), the MeSH paper's recipe; Pythia's values where the paper is silent.
# Run: python train.py config/mesh_1p4b.py   (override any key: --batch_size=4 --max_iters=1000)

# model (Pythia's GPT-NeoX architecture, as the MeSH paper; sizes and layouts as in its Table 1)
flavour = "neox"                # LayerNorm, parallel residual, GELU MLP 4d, rotary 25%, biases, untied
vocab_size = 50304              # GPT-2 BPE 50257 padded to a multiple of 64 (paper: GPT-NeoX BPE, same size)
n_embd = 2048
n_head = 16
layout = "4+8R2+4"              # prelude + core R loops + coda; unrolled depth = 24 (compute-matched)
state_passing = "mesh"
block_size = 4096               # the paper's sequence length (Pythia used 2048)

# data and optimisation (as the MeSH paper states them, unless a line says otherwise)
dataset = "fineweb_edu"        # python prepare_data.py (the paper trained on the Pile; ours: FineWeb-Edu)
total_batch_size = 2_097_152   # tokens per step: 512 sequences x 4096, as the paper
batch_size = 2                 # per GPU per micro-step (ours: fits 80 GB in bf16); accumulation is derived
max_iters = 120_818            # the paper's 253B tokens (Fig. 9); override for shorter runs
learning_rate = 2e-4           # peak LR (Pythia's value for this size)
min_lr = 2e-05                 # cosine decays to 10% of the peak
warmup_iters = 1208            # 1% of the steps
weight_decay = 0.01
beta1 = 0.9
beta2 = 0.95
grad_clip = 1.0                # not stated in the paper; Pythia's value
out_dir = "out/mesh_1p4b"
