use uswap::mm::{Runtime, RuntimeConfig};

#[test]
fn smoke() {
    let rt = Runtime::new(RuntimeConfig { memory_high: 8 << 20, folio_size: 64 << 10, ..RuntimeConfig::default() }).unwrap();
    let mut r = rt.map(64 << 20).unwrap();
    let s = r.as_mut_slice();
    let words = s.len() / 8;
    for i in 0..words {
        s[i * 8..i * 8 + 8].copy_from_slice(&(i as u64).to_le_bytes());
    }
    let st = rt.stats();
    eprintln!("after write: {:?}", st.resident_bytes);
    for i in 0..words {
        let v = u64::from_le_bytes(s[i * 8..i * 8 + 8].try_into().unwrap());
        assert_eq!(v, i as u64, "word {i}");
    }
    let st = rt.stats();
    eprintln!("{:#?}", st.named().iter().filter(|(_, v)| *v > 0).collect::<Vec<_>>());
}
