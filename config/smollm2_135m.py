# SmolLM2-135M: the T²MLR paper's baseline (LLaMA blocks), trained from scratch as the T²MLR
# code's FineWeb run (github.com/princeton-pli/T2MLR, scripts/fineweb).
# Run: python train.py config/smollm2_135m.py

# model (SmolLM2-135M's config, from scratch, as the T²MLR code's FineWeb run)
flavour = "llama"               # RMSNorm, sequential residual, SwiGLU, full rotary, GQA, no biases, tied
vocab_size = 50304              # GPT-2 BPE padded (the T²MLR code used SmolLM2's own 49,152-token vocabulary)
n_layer = 30
n_embd = 576
n_head = 9
n_kv_head = 3                   # grouped-query attention: 3 key/value heads
mlp_hidden = 1536               # SwiGLU width
rope_theta = 100000.0
block_size = 2048

# data and optimisation (the T²MLR code's scripts/fineweb/train_fineweb.sh and its sweep)
dataset = "fineweb_edu"         # FineWeb-Edu sample-10BT, as the T²MLR code
total_batch_size = 524_288      # 256 sequences x 2048 tokens
batch_size = 16                 # sequences per GPU per micro-step; accumulation is derived
max_iters = 20_000              # ~1 epoch of the 10B-token sample (the T²MLR code ran one epoch, ~19k steps)
learning_rate = 6e-4
min_lr = 6e-7                   # cosine_with_min_lr, min_lr_rate 0.001
warmup_iters = 1000             # 5% of the steps
weight_decay = 0.01
beta1 = 0.9
beta2 = 0.98
grad_clip = 1.0
out_dir = "out/smollm2_135m"
