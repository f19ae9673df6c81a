//! Small helpers shared by the built-in tasks.

/// A deterministic RNG for item `index` of a task seeded with `seed`: prompts depend only on
/// (task, seed, index), never on call order.
pub fn item_rng(task: &str, seed: u64, index: u64) -> rand::rngs::StdRng {
    use rand::SeedableRng;
    let mut h = blake3::Hasher::new();
    h.update(task.as_bytes());
    h.update(&seed.to_le_bytes());
    h.update(&index.to_le_bytes());
    rand::rngs::StdRng::from_seed(*h.finalize().as_bytes())
}

/// Truncates very long completions before parsing: the answer of interest is near the end, and
/// reward computation must stay cheap whatever a worker sends. Keeps the last `max` bytes (cut
/// at a char boundary).
pub fn tail(s: &str, max: usize) -> &str {
    if s.len() <= max {
        return s;
    }
    let mut start = s.len() - max;
    while !s.is_char_boundary(start) {
        start += 1;
    }
    &s[start..]
}
