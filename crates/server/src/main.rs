fn main(){sluice_connectors::x()}
