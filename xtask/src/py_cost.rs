//! `cargo xtask py-cost`: the Python binding's own instructions per call of
//! `Peer.transfer_blocks`, against the Rust API it wraps, counted with callgrind in the
//! Soft-RoCE VM. `gdr-py/tests/_binding_cost.py` submits the same transfer many times; callgrind
//! collects only inside the binding's method (`__pymethod_transfer_blocks__`: argument
//! conversion, the block-index lists, the GIL release, the `Transfer` object), and the
//! inclusive cost of `gdr_xfer::peer::Peer::transfer_blocks` inside it is the Rust API's share.
//! The difference per call is the binding's; across block counts, its cost per block index.
//! Counts are reported, never asserted.

use crate::py_test::build_wheel;
use crate::vm::{self, shell_quote, VmOpts};
use crate::{say, Result};

/// Options of `cargo xtask py-cost`.
#[derive(clap::Args, Debug, Clone)]
pub struct PyCostOpts {
    #[command(flatten)]
    pub vm: VmOpts,
    /// Shapes to measure: `BLOCKS:CALLS:KIND` (KIND `list` or `numpy`), comma-separated.
    #[arg(
        long,
        default_value = "1:300:list,1:300:numpy,1000:30:list,1000:30:numpy"
    )]
    pub shapes: String,
    /// Also print callgrind's N most expensive functions (inclusive) inside the binding's
    /// method, for each shape (0: none).
    #[arg(long, default_value_t = 0)]
    pub annotate: usize,
}

/// One measured shape.
struct Shape {
    blocks: u64,
    calls: u64,
    kind: String,
}

fn shapes(text: &str) -> Result<Vec<Shape>> {
    text.split(',')
        .map(|s| {
            let parts: Vec<&str> = s.trim().split(':').collect();
            match parts.as_slice() {
                [b, c, k] if matches!(*k, "list" | "numpy") => Ok(Shape {
                    blocks: b.parse().map_err(|e| format!("--shapes {s:?}: {e}"))?,
                    calls: c.parse().map_err(|e| format!("--shapes {s:?}: {e}"))?,
                    kind: (*k).to_string(),
                }),
                _ => Err(format!("--shapes {s:?}: expected BLOCKS:CALLS:list|numpy")),
            }
        })
        .collect()
}

pub fn py_cost(opts: &PyCostOpts) -> Result<i32> {
    let shapes = shapes(&opts.shapes)?;
    let wheel = build_wheel("python3")?;
    let python = shell_quote(&wheel.python.to_string_lossy());
    let mut script = String::from("export PYTHONDONTWRITEBYTECODE=1\ncd gdr-py/tests\n");
    for (i, s) in shapes.iter().enumerate() {
        script.push_str(&format!(
            "valgrind --tool=callgrind --callgrind-out-file=/tmp/py.{i} \
             --toggle-collect='*__pymethod_transfer_blocks__*' \
             {python} _binding_cost.py {b} {c} {k} > /tmp/py-run.{i} 2>&1 || {{ cat /tmp/py-run.{i}; exit 1; }}\n\
             grep '^binding-cost-run' /tmp/py-run.{i}\n\
             callgrind_annotate --inclusive=yes /tmp/py.{i} > /tmp/py-incl.{i}\n\
             wrapper=$(awk '/__pymethod_transfer_blocks__/ {{gsub(\",\",\"\",$1); if ($1+0 > m) m=$1+0}} END {{print m+0}}' /tmp/py-incl.{i})\n\
             api=$(awk '/gdr_xfer::peer::Peer::transfer_blocks/ {{gsub(\",\",\"\",$1); if ($1+0 > m) m=$1+0}} END {{print m+0}}' /tmp/py-incl.{i})\n\
             echo \"py-cost shape={i} wrapper=$wrapper api=$api\"\n\
             [ {n} -eq 0 ] || {{ echo '== shape {i}: inclusive cost by function =='; head -n {lines} /tmp/py-incl.{i}; }}\n",
            n = opts.annotate,
            lines = opts.annotate + 20,
            b = s.blocks,
            c = s.calls,
            k = s.kind,
        ));
    }
    say!(
        "measuring {} shapes under callgrind in the VM",
        shapes.len()
    );
    let outcome = vm::boot_ok(&opts.vm, &script, "the measurement")?;
    println!(
        "blocks  calls  indices   binding+API/call   Rust API/call   binding/call   binding/block"
    );
    let mut one_block: std::collections::HashMap<String, f64> = Default::default();
    for line in outcome.output.lines() {
        let Some(rest) = line.trim().strip_prefix("py-cost ") else {
            continue;
        };
        let field = |k: &str| -> u64 {
            rest.split_whitespace()
                .find_map(|f| f.strip_prefix(k).and_then(|v| v.parse().ok()))
                .unwrap_or(0)
        };
        let Some(s) = shapes.get(field("shape=") as usize) else {
            continue;
        };
        let (wrapper, api) = (field("wrapper="), field("api="));
        let calls = s.calls.max(1) as f64;
        let binding = wrapper.saturating_sub(api) as f64 / calls;
        // Per block: the growth of the binding's cost over the 1-block shape of the same kind.
        let per_block = match one_block.get(&s.kind) {
            Some(base) if s.blocks > 1 => {
                format!("{:.1}", (binding - base) / (s.blocks - 1) as f64)
            }
            _ => "-".to_string(),
        };
        if s.blocks == 1 {
            one_block.insert(s.kind.clone(), binding);
        }
        println!(
            "{:>6} {:>6}  {:<7} {:>18.0} {:>15.0} {:>14.0} {:>15}",
            s.blocks,
            s.calls,
            s.kind,
            wrapper as f64 / calls,
            api as f64 / calls,
            binding,
            per_block
        );
    }
    Ok(0)
}
