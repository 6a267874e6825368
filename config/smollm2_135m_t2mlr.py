# T²MLR on SmolLM2-135M: the middle 20% of the stack (layers 12..17, "window 6") is recurrent in time;
# the other settings are the T²MLR code's FineWeb run's (princeton-pli/T2MLR, scripts/fineweb).
# Run: python train.py config/smollm2_135m_t2mlr.py
# Other recurrent ranges: the T²MLR code's scripts take a symmetric middle window, l_end = L - 1 - l_start
# (30 layers); we name them by the number of recurrent layers (the T²MLR code's "D<n>", not the Jacobi D);
# its released sweep runs 22. As overrides:
#   window 2   --l_start=14 --l_end=15      window 14  --l_start=8 --l_end=21
#   window 22  --l_start=4  --l_end=25      window 30  --l_start=0 --l_end=29
# Retrofit a trained SmolLM2 checkpoint (the gate starts as an exact identity):
#   python train.py config/smollm2_135m_t2mlr.py --init_from=out/smollm2_135m/ckpt.pt

# model (SmolLM2-135M's config, from scratch, as the T²MLR code's FineWeb run): the baseline ...
flavour = "llama"               # RMSNorm, sequential residual, SwiGLU, full rotary, GQA, no biases, tied
vocab_size = 50304              # GPT-2 BPE padded (the T²MLR code used SmolLM2's own 49,152-token vocabulary)
n_layer = 30
n_embd = 576
n_head = 9
n_kv_head = 3                   # grouped-query attention: 3 key/value heads
mlp_hidden = 1536               # SwiGLU width
rope_theta = 100000.0
block_size = 2048
# ... plus temporal middle-layer recurrence (the T²MLR code's gate, state update, Jacobi; its FineWeb settings)
t2mlr = True
l_start = 12                    # the gate mixes R_{t-1} into the input of layer 12
l_end = 17                      # the state R_t is written from the output of layer 17
jacobi_sweeps = 16             # D: Jacobi sweeps per step, the final one included (positions < D exact)
jacobi_grad_sweeps = 4         # b: sweeps before the final one that keep gradient (b + 1 with autograd)
recurrent_residual = True           # R_t = s·(h_t + R_{t-1}), clamped stop-gradient RMS scale s
recurrent_detach = False            # gradient flows along the R chain (FineWeb setting)

# data and optimisation (the T²MLR code's scripts/fineweb/train_fineweb.sh and its sweep)
dataset = "fineweb_edu"         # FineWeb-Edu sample-10BT, as the T²MLR code
total_batch_size = 524_288      # 256 sequences x 2048 tokens
batch_size = 8                  # per GPU per micro-step (Jacobi keeps b + 1 copies of the middle activations)
max_iters = 20_000              # ~1 epoch of the 10B-token sample (the T²MLR code ran one epoch, ~19k steps)
learning_rate = 6e-4
min_lr = 6e-7                   # cosine_with_min_lr, min_lr_rate 0.001
warmup_iters = 1000             # 5% of the steps
weight_decay = 0.01
beta1 = 0.9
beta2 = 0.98
grad_clip = 1.0
out_dir = "out/smollm2_135m_t2mlr"
