"""The Hugging Face seam: the Hub and the local HF cache (imports nothing here: `list` reads the cache's state
through state.py without loading httpx or huggingface_hub). Every change in the cache goes through its
ownedfs.Owned; every name from the Hub, a mirror or a file read back passes its grammar (metralectl/names.py) first.

    weights   `pull`: list the repo at a commit, choose what the engine needs, refuse early, download, verify,
              write the manifest (the only importer of huggingface_hub, for the token alone); run/swap's
              preflight (weights_preflight, serving_preflight)
    state     filesystem only: what the cache holds of a checkpoint (checkpoint_state; status, `list`'s
              column, one lstat for a repository the hub has no folder for)
    cache     the cache on disk as the engine reads it: layout, manifests, a snapshot's state
    gguf      a GGUF quant: llama.cpp's rule for its files, their state in the cache, what llama-server reads
    listing   a repository's files at a commit, and the rules every listing passes
    hub       requests to the Hub over httpx on our terms (capped, redirects by hand); its answers as our errors
    steps     a pull's steps: ownership, the pull lock, dead downloads, disk; then download and verify
    download  metralectl's own download of one file: names from the listing only, resumable for large files
    staging   worker threads Ctrl-C can stop, byte accounting, hashing; the part files kept across runs
"""
