"""The supervisor's wire and its durable state, shared by both of its sides: messages, frames,
records, proofs, the state directory and the journal."""
