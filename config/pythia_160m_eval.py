# Evaluate the released Pythia-160M (EleutherAI, the MeSH paper's vanilla baseline family) on our data:
# GPT.from_pretrained maps its GPT-NeoX checkpoint onto our neox layers exactly (test_pretrained.py).
# max_iters = 0: train.py evaluates at step 0 and writes the checkpoint; sample.py then samples from it.
#
#   python prepare_data.py --tokenizer hf:EleutherAI/pythia-160m --name fineweb_edu_pythia   # its tokenizer
#   python train.py config/pythia_160m_eval.py
#   python sample.py --out_dir=out/pythia_160m_eval --start="The history of" --temperature=0
# A fine-tune: the same with --max_iters=1000 (and a learning rate, e.g. --learning_rate=6e-5 --min_lr=6e-6).

init_from = "hf:EleutherAI/pythia-160m"
dataset = "fineweb_edu_pythia"
block_size = 2048               # Pythia's context
max_iters = 0
eval_iters = 50                 # 50 x batch_size windows of 2048 tokens
batch_size = 8
total_batch_size = 16_384
learning_rate = 6e-5
min_lr = 6e-6
warmup_iters = 0
out_dir = "out/pythia_160m_eval"
