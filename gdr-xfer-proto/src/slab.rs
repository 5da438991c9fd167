//! Transfers by key: a slab whose keys carry a generation, so that a key of a finished transfer
//! never names a later one that took its place.

use crate::transfer::TransferKey;

enum Entry<T> {
    Vacant { gen: u32 },
    Occupied { gen: u32, value: T },
}

/// The transfers of a connection.
pub(crate) struct Slab<T> {
    entries: Vec<Entry<T>>,
    free: Vec<u32>,
    len: usize,
}

impl<T> Slab<T> {
    pub(crate) fn new() -> Self {
        Slab {
            entries: Vec::new(),
            free: Vec::new(),
            len: 0,
        }
    }

    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Inserts `value`; its key.
    pub(crate) fn insert(&mut self, value: T) -> TransferKey {
        self.len += 1;
        if let Some(index) = self.free.pop() {
            let e = &mut self.entries[index as usize];
            let gen = match e {
                Entry::Vacant { gen } => gen.wrapping_add(1),
                Entry::Occupied { .. } => unreachable!("a free slot is vacant"),
            };
            *e = Entry::Occupied { gen, value };
            return TransferKey { index, gen };
        }
        let index = self.entries.len() as u32;
        self.entries.push(Entry::Occupied { gen: 0, value });
        TransferKey { index, gen: 0 }
    }

    pub(crate) fn get(&self, key: TransferKey) -> Option<&T> {
        match self.entries.get(key.index as usize)? {
            Entry::Occupied { gen, value } if *gen == key.gen => Some(value),
            _ => None,
        }
    }

    pub(crate) fn get_mut(&mut self, key: TransferKey) -> Option<&mut T> {
        match self.entries.get_mut(key.index as usize)? {
            Entry::Occupied { gen, value } if *gen == key.gen => Some(value),
            _ => None,
        }
    }

    pub(crate) fn remove(&mut self, key: TransferKey) -> Option<T> {
        let e = self.entries.get_mut(key.index as usize)?;
        match e {
            Entry::Occupied { gen, .. } if *gen == key.gen => {
                let gen = *gen;
                let Entry::Occupied { value, .. } = std::mem::replace(e, Entry::Vacant { gen })
                else {
                    return None;
                };
                self.free.push(key.index);
                self.len -= 1;
                Some(value)
            }
            _ => None,
        }
    }

    /// Every key, in slot order.
    pub(crate) fn keys(&self) -> Vec<TransferKey> {
        self.entries
            .iter()
            .enumerate()
            .filter_map(|(i, e)| match e {
                Entry::Occupied { gen, .. } => Some(TransferKey {
                    index: i as u32,
                    gen: *gen,
                }),
                Entry::Vacant { .. } => None,
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reused_slot_gets_a_new_generation() {
        let mut s = Slab::new();
        let a = s.insert('a');
        assert_eq!(s.remove(a), Some('a'));
        let b = s.insert('b');
        assert_eq!(a.index, b.index);
        assert_ne!(a, b);
        assert_eq!(s.get(a), None);
        assert_eq!(s.remove(a), None);
        assert_eq!(s.get(b), Some(&'b'));
        assert_eq!(s.len(), 1);
        assert_eq!(s.keys(), vec![b]);
    }
}

#[cfg(test)]
mod mutant_tests;
