//! Size classes: which object sizes share a zspage shape.
//!
//! As in zsmalloc, classes go in 16-byte steps from 32 B to 4096 B. Each
//! class chains 1..=8 pages into a zspage, the count chosen so that the
//! objects waste the least of it. Neighbouring classes that end up with the
//! same shape (pages per zspage and objects per zspage) are merged into the
//! larger one: they would use memory identically, and fewer classes means
//! fewer half-empty zspages.

use super::{MAX_PAGES_PER_ZSPAGE, PAGE_SIZE};

pub(crate) const MIN_SIZE: usize = 32;
pub(crate) const MAX_SIZE: usize = PAGE_SIZE;
pub(crate) const STEP: usize = 16;
/// Used fraction (basis points) at which a shorter zspage chain is preferred.
const GOOD_ENOUGH_BP: usize = 9_300;

/// The shape of one (merged) class.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClassShape {
    /// Object slot size in bytes.
    pub size: usize,
    /// Pages chained into one zspage.
    pub pages_per_zspage: usize,
    /// Objects one zspage holds.
    pub objs_per_zspage: usize,
}

fn best_shape(size: usize) -> ClassShape {
    let shape = |pages: usize| ClassShape {
        size,
        pages_per_zspage: pages,
        objs_per_zspage: pages * PAGE_SIZE / size,
    };
    // Used fraction in basis points.
    let used = |s: ClassShape| s.objs_per_zspage * size * 10_000 / (s.pages_per_zspage * PAGE_SIZE);
    // The shortest chain that wastes at most GOOD_ENOUGH of its zspage:
    // every class has one partly filled zspage, so a longer chain costs
    // more in that last zspage than it saves at its end. Failing that, the
    // chain that wastes least.
    (1..=MAX_PAGES_PER_ZSPAGE)
        .map(shape)
        .find(|&s| used(s) >= GOOD_ENOUGH_BP)
        .unwrap_or_else(|| {
            (1..=MAX_PAGES_PER_ZSPAGE)
                .map(shape)
                .fold(
                    shape(1),
                    |best, s| if used(s) > used(best) { s } else { best },
                )
        })
}

/// The merged classes, and for each 16-byte size step the class it maps to.
pub(crate) fn build() -> (Vec<ClassShape>, Vec<u8>) {
    let steps = (MAX_SIZE - MIN_SIZE) / STEP + 1;
    let shapes: Vec<ClassShape> = (0..steps)
        .map(|i| best_shape(MIN_SIZE + i * STEP))
        .collect();
    let mut classes: Vec<ClassShape> = Vec::new();
    let mut step_to_class = vec![0u8; steps];
    // From the largest down: a step whose shape equals the class above it
    // joins that class.
    for i in (0..steps).rev() {
        let s = shapes[i];
        let joins = classes.last().is_some_and(|c: &ClassShape| {
            c.pages_per_zspage == s.pages_per_zspage && c.objs_per_zspage == s.objs_per_zspage
        });
        if !joins {
            classes.push(s);
        }
        step_to_class[i] = (classes.len() - 1) as u8;
    }
    // Number classes from the smallest up.
    let n = classes.len();
    classes.reverse();
    for c in &mut step_to_class {
        *c = (n - 1) as u8 - *c;
    }
    (classes, step_to_class)
}

/// The 16-byte step an object of `len` bytes falls in.
pub(crate) fn step_of(len: usize) -> usize {
    len.max(MIN_SIZE).div_ceil(STEP) - MIN_SIZE / STEP
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_size_maps_to_a_class_that_fits_it() {
        let (classes, steps) = build();
        assert!(classes.len() < 256);
        for len in 1..=MAX_SIZE {
            let c = classes[steps[step_of(len)] as usize];
            assert!(c.size >= len, "{len} -> {c:?}");
            assert!(c.objs_per_zspage >= 1);
            assert!(c.size * c.objs_per_zspage <= c.pages_per_zspage * PAGE_SIZE);
        }
    }

    #[test]
    fn shapes_waste_little_and_merged_classes_are_distinct() {
        let (classes, _) = build();
        for w in classes.windows(2) {
            assert!(w[0].size < w[1].size);
            assert!(
                (w[0].pages_per_zspage, w[0].objs_per_zspage)
                    != (w[1].pages_per_zspage, w[1].objs_per_zspage)
            );
        }
        for c in &classes {
            let used =
                (c.size * c.objs_per_zspage) as f64 / (c.pages_per_zspage * PAGE_SIZE) as f64;
            assert!(used > 0.85 || c.size > 3000, "{c:?} uses {used:.2}");
        }
        assert_eq!(classes.last().unwrap().size, PAGE_SIZE);
    }
}
