//! `erpc-vfio`: list PCI functions, check one for VFIO, bind it to vfio-pci
//! and back. See `erpc_tools::vfio_tool` for what each command does.
#![forbid(unsafe_code)]

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand};
use erpc_tools::vfio_tool::{self, Env, Plan, ToolError};
use mlx5::vfio::PciAddress;
use mlx5::vfio::sysfs::Sysfs;

/// Prepare PCI functions (mlx5 NICs) for the userspace driver: list them,
/// check one, bind it to vfio-pci and give it back to its kernel driver.
/// Exit code of `status` when the function is not ready for VFIO (the
/// report says what to do). 0: ready, or any other command done; 1: an
/// error or a refusal; 2: bad arguments.
const EXIT_NOT_READY: u8 = 3;

#[derive(Debug, Parser)]
#[command(
    name = "erpc-vfio",
    version,
    after_help = "Exit status: 0 done (for `status`: ready for VFIO), 1 error or refusal, \
                  2 bad arguments, 3 `status`: not ready (the report says what to do)."
)]
struct Cli {
    /// Print JSON instead of text.
    #[arg(long, global = true)]
    json: bool,
    /// sysfs root.
    #[arg(long, global = true, default_value = "/sys", hide = true)]
    sysfs: PathBuf,
    /// procfs root.
    #[arg(long = "proc", global = true, default_value = "/proc", hide = true)]
    proc_root: PathBuf,
    /// Directory of the VFIO nodes.
    #[arg(long, global = true, default_value = "/dev/vfio", hide = true)]
    dev_vfio: PathBuf,
    /// Where `bind` records the previous driver of a function.
    #[arg(long, global = true, default_value = "/run/erpc-vfio")]
    state_dir: PathBuf,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// List PCI functions: ids, driver, IOMMU group, NUMA node, mlx5 or not.
    List,
    /// Show whether a function is ready for VFIO and what is missing
    /// (exit status 0 if ready, 3 if not).
    Status {
        /// PCI address, DDDD:BB:DD.F.
        bdf: PciAddress,
    },
    /// Bind a function to vfio-pci (driver_override + drivers_probe),
    /// recording its previous driver.
    Bind {
        /// PCI address, DDDD:BB:DD.F.
        bdf: PciAddress,
        /// Print the sysfs writes, change nothing.
        #[arg(long)]
        dry_run: bool,
        /// Bind even the function that carries the default route.
        #[arg(long)]
        force: bool,
    },
    /// Return a function from vfio-pci to the driver `bind` recorded.
    Unbind {
        /// PCI address, DDDD:BB:DD.F.
        bdf: PciAddress,
        /// Print the sysfs writes, change nothing.
        #[arg(long)]
        dry_run: bool,
    },
}

/// Writes to stdout; a reader that went away (`erpc-vfio list | head`)
/// ends the process quietly instead of a panic in `println!`. Output
/// comes after any change the command made, so nothing is cut short.
fn emit(text: std::fmt::Arguments<'_>) {
    use std::io::Write;
    if let Err(e) = std::io::stdout().lock().write_fmt(text) {
        if e.kind() == std::io::ErrorKind::BrokenPipe {
            std::process::exit(0);
        }
        eprintln!("erpc-vfio: cannot write to standard output: {e}");
        std::process::exit(1);
    }
}

macro_rules! out {
    ($($arg:tt)*) => { emit(format_args!($($arg)*)) };
}

macro_rules! outln {
    ($($arg:tt)*) => { emit(format_args!("{}\n", format_args!($($arg)*))) };
}

fn main() -> ExitCode {
    erpc_tools::init_tracing();
    let cli = Cli::parse();
    let env = Env {
        sysfs: Sysfs::new(&cli.sysfs),
        proc_root: cli.proc_root.clone(),
        dev_vfio: cli.dev_vfio.clone(),
        state_dir: cli.state_dir.clone(),
    };
    match run(&cli, &env) {
        Ok(code) => code,
        Err(err) => {
            if cli.json {
                let kind = format!("{err:?}");
                let kind = kind.split([' ', '{', '(']).next().unwrap_or("Error");
                outln!(
                    "{}",
                    serde_json::json!({ "ok": false, "kind": kind, "error": err.to_string() })
                );
            }
            eprintln!("erpc-vfio: {err}");
            ExitCode::FAILURE
        }
    }
}

fn print_json(value: &impl serde::Serialize) {
    outln!(
        "{}",
        serde_json::to_string_pretty(value).expect("reports serialize")
    );
}

fn run(cli: &Cli, env: &Env) -> Result<ExitCode, ToolError> {
    match &cli.command {
        Command::List => {
            let rows = vfio_tool::list(env)?;
            if cli.json {
                print_json(&rows);
            } else {
                out!("{}", vfio_tool::render_list(&rows));
            }
        }
        Command::Status { bdf } => {
            let status = vfio_tool::status(env, *bdf)?;
            if cli.json {
                print_json(&status);
            } else {
                out!("{}", vfio_tool::render_status(&status));
            }
            if !status.ready {
                return Ok(ExitCode::from(EXIT_NOT_READY));
            }
        }
        Command::Bind {
            bdf,
            dry_run,
            force,
        } => {
            let plan = vfio_tool::plan_bind(env, *bdf, *force)?;
            execute(cli, env, &plan, *dry_run, "bind")?;
        }
        Command::Unbind { bdf, dry_run } => {
            let plan = vfio_tool::plan_unbind(env, *bdf)?;
            execute(cli, env, &plan, *dry_run, "unbind")?;
        }
    }
    Ok(ExitCode::SUCCESS)
}

fn execute(
    cli: &Cli,
    env: &Env,
    plan: &Plan,
    dry_run: bool,
    command: &'static str,
) -> Result<(), ToolError> {
    if !dry_run && !plan.already_done && vfio_tool::effective_uid(&env.proc_root) != Some(0) {
        return Err(ToolError::NotRoot { command });
    }
    if !dry_run {
        vfio_tool::apply(plan)?;
        vfio_tool::verify(env, plan, Duration::from_secs(5))?;
    }
    let driver_now = env.sysfs.driver(plan.bdf).ok().flatten();
    let node = env
        .sysfs
        .iommu_group(plan.bdf)
        .ok()
        .flatten()
        .map(|g| env.dev_vfio.join(g.to_string()));
    if cli.json {
        print_json(&serde_json::json!({
            "ok": true,
            "action": plan.action,
            "bdf": plan.bdf,
            "dry_run": dry_run,
            "already_done": plan.already_done,
            "writes": plan.writes,
            "record": plan.record,
            "state_file": plan.state_file,
            "driver": driver_now,
            "vfio_node": node.as_ref().filter(|n| n.exists()),
        }));
        return Ok(());
    }
    let previous = |p: &Plan| {
        p.record
            .as_ref()
            .and_then(|r| r.previous_driver.clone())
            .unwrap_or_else(|| "none".into())
    };
    if plan.already_done {
        outln!("{} is already bound to vfio-pci; nothing to do", plan.bdf);
        return Ok(());
    }
    if dry_run {
        outln!("dry run: `erpc-vfio {command} {}` would write:", plan.bdf);
        for line in plan.shell().lines() {
            outln!("  {line}");
        }
        match command {
            "bind" => outln!(
                "and record the previous driver ({}) in {}",
                previous(plan),
                plan.state_file.display()
            ),
            _ => outln!(
                "and expect the function to end up on {} ({})",
                plan.expect_driver.as_deref().unwrap_or("no driver"),
                if plan.record.is_some() {
                    "as `bind` recorded"
                } else {
                    "no record from `bind`: the kernel picks"
                }
            ),
        }
        return Ok(());
    }
    match command {
        "bind" => outln!(
            "bound {} to vfio-pci: {} (previous driver {}, recorded in {})",
            plan.bdf,
            node.map_or("-".into(), |n| n.display().to_string()),
            previous(plan),
            plan.state_file.display()
        ),
        _ => outln!(
            "unbound {} from vfio-pci; now on {}",
            plan.bdf,
            driver_now.as_deref().unwrap_or("no driver")
        ),
    }
    Ok(())
}
