fn main() -> std::process::ExitCode {
    escha_convert::cli::main(std::env::args_os().collect())
}
