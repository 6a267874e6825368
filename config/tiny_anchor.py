# Tiny recursive model, +anchor h(t+1) = f_core(h(t)) + h(0): 2+2R2+2, 8 layers' compute, 6 layers' weights.
# Everything but the layout and state passing equals tiny_vanilla.py, so the val losses compare directly.
# Run: python prepare_data.py --source pydoc --tokenizer byte && python train.py config/tiny_anchor.py

# model
flavour = "neox"               # the MeSH paper's block: LayerNorm, parallel residual, GELU MLP, 25% rotary
vocab_size = 320               # byte tokenizer: 256 bytes + EOT = 257, padded up to a multiple of 64
block_size = 256               # context length: long enough for a few lines of the Python manual
n_embd = 128                   # small enough for CPU, wide enough for the loss to fall well below unigram
n_head = 4                     # head dim 32
layout = "2+2R2+2"             # 2 prelude + 2 core layers looped K=2 times + 2 coda: unrolled depth 8
state_passing = "anchor"          # how the state passes between the two core loops

# data
dataset = "pydoc"              # the Python reference manual that ships with CPython: no download needed

# optimisation: 4 sequences x 256 tokens x 4 micro-steps per step
total_batch_size = 4096        # tokens per optimizer step
batch_size = 4                 # sequences per micro-step; accumulation (4) exercises the accumulation path
max_iters = 300                # 1.2M tokens: ~2.7 passes over the 0.46M-token train split, ~3 min on 2 cores
learning_rate = 2e-3           # tiny models tolerate (and need) a larger LR than the 6e-4 of 160M
min_lr = 2e-4                  # cosine to 10% of the peak
warmup_iters = 30              # 10% of the run
weight_decay = 0.1             # nanoGPT's default
grad_clip = 1.0                # keeps the high-LR start stable

# evaluation, logging, system
eval_interval = 100            # evaluations at steps 0, 100, 200 and 300
eval_iters = 8                 # 8 x 4 windows = 32 x 256 = 8K of the 11K val tokens
log_interval = 20              # a log line every 20 steps
device = "cpu"                 # the point of the tiny configs; override with --device=cuda
compile = False                # compiling would cost more than it saves at this size
out_dir = "out/tiny_anchor"
