"""Retrieval: document loaders, chunking, embeddings, the hybrid index."""
